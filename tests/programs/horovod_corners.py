"""Horovod's API in the corners a review found unlike Horovod 0.28.1 (2 instances or more): an LR scheduler made
before the optimizer is wrapped, ``broadcast_parameters(model.parameters())``, a fresh optimizer's state,
``sparse_as_dense`` with ``SparseAdam``, names imported from ``horovod.torch.mpi_ops``, float16 scaling,
``DistributedOptimizer``'s checks and ``set_backward_passes_per_step``, an allgather of mismatched shapes,
allreduces of mismatched scale factors, dtypes and ops, an allgather of 0-d tensors, and the names ``barrier``,
``grouped_allreduce_async``, ``cuda_built``, ``horovod.common.exceptions``. Each rank prints its results as JSON."""

import json
import warnings

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError
from horovod.torch.mpi_ops import Average, Sum, local_rank, synchronize

hvd.init()
r = hvd.rank()
out = {"rank": r, "size": hvd.size(), "imported": [int(Average), int(Sum), local_rank() == r, callable(synchronize)]}
torch.manual_seed(0)


def same_everywhere(tensors):
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return bool(torch.equal(hvd.allreduce(flat, op=hvd.Max), hvd.allreduce(flat, op=hvd.Min)))


# an LR scheduler made before the optimizer is wrapped: the wrapped step still reduces
model = torch.nn.Linear(3, 2)
hvd.broadcast_parameters(list(model.parameters()), root_rank=0)  # (bare tensors, as Horovod takes them)
out["parameters_broadcast"] = same_everywhere(model.parameters())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
model(torch.full((2, 3), float(r + 1))).sum().backward()
optimizer.step()
scheduler.step()
out["scheduler_first"] = [same_everywhere(model.parameters()), optimizer.param_groups[0]["lr"]]

# a fresh optimizer's state, as Horovod starts it: zero gradients and one step of its own
fresh_model = torch.nn.Linear(2, 1)
hvd.broadcast_parameters(fresh_model.state_dict(), root_rank=0)
adam = torch.optim.Adam(fresh_model.parameters(), lr=0.1, weight_decay=0.5)
hvd.broadcast_optimizer_state(adam, root_rank=0, model=fresh_model)
out["fresh_state"] = [sorted(int(s["step"]) for s in adam.state.values()),
                      [p.grad.abs().sum().item() for p in fresh_model.parameters()],
                      same_everywhere(fresh_model.parameters())]

# sparse gradients made dense for the reduction, sparse again for SparseAdam
embedding = torch.nn.Embedding(4, 2, sparse=True)
hvd.broadcast_parameters(embedding.state_dict(), root_rank=0)
sparse_adam = hvd.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
                                       sparse_as_dense=True)
embedding(torch.tensor([r, 3])).sum().backward()
sparse_adam.step()
out["sparse_adam"] = same_everywhere(embedding.parameters())

# float16 scaled in float32, rounded once, as Horovod's buffer scaling
half = torch.tensor([-99.0, -69.0, 65.0], dtype=torch.float16)
out["fp16_prescale"] = hvd.allreduce(half, op=hvd.Max, prescale_factor=0.19151945).tolist()

# DistributedOptimizer's checks and API
checks = []
for named in ([("w", model.weight), ("w", model.bias)], [("weight", model.weight)]):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named)
    except ValueError as exc:
        checks.append(str(exc).split(";")[0])
plain = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2)
plain.set_backward_passes_per_step(3)
model(torch.ones(1, 3)).sum().backward()
plain.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plain.step()
out["optimizer_api"] = [checks, plain.backward_passes_per_step,
                        [str(w.message).split(";")[0] for w in caught]]

# an allgather of mismatched shapes is a RuntimeError, as Horovod's, and the job goes on
try:
    hvd.allgather(torch.zeros(1, 2 + r))
    out["allgather_mismatch"] = None
except RuntimeError as exc:
    out["allgather_mismatch"] = [type(exc).__name__, isinstance(exc, HorovodInternalError)]
hvd.barrier()


def refused(call):
    try:
        call()
        return None
    except HorovodInternalError as exc:
        return str(exc)


# an allgather of a rank-zero tensor is refused on every rank, as Horovod's, whoever passes it
out["allgather_0d"] = [refused(lambda: hvd.allgather(torch.tensor(float(r)))),
                       refused(lambda: hvd.allgather(torch.tensor(1.0) if r == 0 else torch.ones(1)))]


# allreduces whose op, scale factors or dtype differ where the fabric's call would not: Horovod's errors on
# every rank, and the job goes on
f = torch.tensor([1.0, 2.0])
out["allreduce_mismatch"] = [
    refused(lambda: hvd.allreduce(f, op=hvd.Sum, postscale_factor=2.0 if r == 0 else 1.5)),
    refused(lambda: hvd.allreduce(f.bfloat16() if r == 0 else f, op=hvd.Sum, prescale_factor=0.5)),
    refused(lambda: hvd.allreduce(torch.tensor([r]), op=hvd.Average if r == 0 else hvd.Min, postscale_factor=3.0)),
]
handle = hvd.grouped_allreduce_async([torch.ones(2), torch.ones(1)], op=hvd.Sum)
out["grouped_async"] = [t.tolist() for t in hvd.synchronize(handle)]
out["built"] = [hvd.cuda_built(), hvd.rocm_built()]
print(json.dumps(out), flush=True)
