"""Horovod's semantics over the fabric, each result printed as JSON for the test to check (run by
tests/test_compat.py on 3 instances)."""

import json

import horovod.torch as hvd
import torch

import popdist

hvd.init()
popdist.init()  # after hvd.init(), as Graphcore's programs may: both start
hvd.init()  # idempotent
r, n = hvd.rank(), hvd.size()
out = {"rank": r, "size": n, "local": [hvd.local_rank(), hvd.local_size()], "cross": [hvd.cross_rank(), hvd.cross_size()]}

t = torch.tensor([1.0 + r, 2.0 * r])
out["average"] = hvd.allreduce(t).tolist()
out["sum"] = hvd.allreduce(t, op=hvd.Sum).tolist()
out["min_max_product"] = [hvd.allreduce(t, op=op).tolist() for op in (hvd.Min, hvd.Max, hvd.Product)]
out["average_false"] = hvd.allreduce(t, average=False).tolist()
out["bfloat16"] = [str(hvd.allreduce(t.to(torch.bfloat16), op=hvd.Sum).dtype),
                   hvd.allreduce(t.to(torch.bfloat16), op=hvd.Sum).float().tolist()]
out["int_average"] = hvd.allreduce(torch.tensor([r + 1])).tolist()
out["fp16_compression"] = [str(v) for v in (hvd.allreduce(t, compression=hvd.Compression.fp16).dtype,)]
inplace = t.clone()
same = hvd.allreduce_(inplace, op=hvd.Sum)
out["inplace"] = [same is inplace, inplace.tolist()]
weight, saved = torch.tensor([2.0], requires_grad=True), torch.tensor([3.0])
product = weight * saved  # autograd keeps ``saved`` for the gradient; changing it in place must be seen
hvd.allreduce_(saved)
try:
    product.backward()
    out["inplace_seen"] = "not seen"
except RuntimeError as exc:
    out["inplace_seen"] = "modified by an inplace operation" in str(exc)
out["scaled"] = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist()

w = torch.tensor([1.0 + r], requires_grad=True)
(hvd.allreduce(w, op=hvd.Sum) * (r + 1)).sum().backward()
out["grad"] = w.grad.tolist()  # the sum over ranks of (rank + 1)

out["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r))).tolist()  # first dims 1, 2, 3
rows = torch.ones(r + 1, 2, requires_grad=True)
hvd.allgather(rows).sum().backward()
out["allgather_grad"] = rows.grad.tolist()  # this rank's rows of the averaged gradient (Horovod >= 0.22)
source = torch.tensor([1.0], requires_grad=True)
hvd.broadcast(source, root_rank=1).sum().backward()
out["broadcast_grad"] = source.grad.tolist()  # the root gets the ranks' average gradient, the others none
b = torch.tensor([10.0 * r])
out["broadcast"] = hvd.broadcast(b, root_rank=1).tolist()
hvd.broadcast_(b, root_rank=2)
out["broadcast_"] = b.tolist()
parameter = torch.nn.Parameter(torch.tensor([r, 2.0 * r]))
hvd.broadcast_(parameter, root_rank=1)
out["broadcast_parameter"] = [parameter.tolist(), parameter.requires_grad, parameter._version > 0]
out["object"] = hvd.broadcast_object({"from": r, "list": [r] * 2}, root_rank=1)
out["objects"] = hvd.allgather_object(("rank", r))

out["int_average_scaled"] = hvd.allreduce(torch.tensor([1 if r == 1 else 2]), postscale_factor=2.0).tolist()
done = hvd.allreduce_async(t, op=hvd.Sum)
out["synchronize_twice"] = [hvd.synchronize(done).tolist(), hvd.synchronize(done)]
for dense in (False, True):  # an embedding's sparse gradient: gathered, or made dense (sparse_as_dense)
    embedding = torch.nn.Embedding(4, 2, sparse=True)
    with torch.no_grad():
        embedding.weight.fill_(1.0)
    sparse_opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0), sparse_as_dense=dense)
    embedding(torch.tensor([r])).sum().backward()
    sparse_opt.step()
    out[f"sparse_as_dense_{dense}"] = embedding.weight.tolist()
try:
    out["lambdas"] = [f(1) for f in hvd.allgather_object(lambda x: x + 1)]  # with cloudpickle, as Horovod
except Exception as exc:  # noqa: BLE001 - without it, the error says what to install
    out["lambdas"] = f"{type(exc).__name__}: {exc}"

torch.manual_seed(r)  # every instance starts from other weights
model = torch.nn.Linear(3, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
for step in range(3):
    optimizer.zero_grad()
    x = torch.full((4, 3), float(r + step))  # each instance its own data
    model(x).pow(2).mean().backward()
    optimizer.step()
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
out["optimizer_class"] = [type(optimizer).__name__, isinstance(optimizer, torch.optim.SGD)]
out["weights_everywhere_equal"] = bool(torch.equal(hvd.allreduce(weights, op=hvd.Max), hvd.allreduce(weights, op=hvd.Min)))

errors = []
for call in (lambda: hvd.allreduce(t, op=hvd.Sum, average=True), lambda: hvd.allreduce(t, op=hvd.Adasum),
             lambda: hvd.broadcast(t, root_rank=n)):
    try:
        call()
    except (ValueError, NotImplementedError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
out["errors"] = errors
try:
    hvd.join()
except AttributeError as exc:
    out["missing"] = str(exc)
try:  # instances naming different roots: Horovod's error on every one (at three, each kept its own before)
    hvd.broadcast(torch.ones(1), root_rank=r % 2)
    out["root_mismatch"] = None
except RuntimeError as exc:
    out["root_mismatch"] = str(exc)
print(json.dumps(out), flush=True)
hvd.shutdown()
out_after = hvd.is_initialized()
print(json.dumps({"rank": r, "initialized_after_shutdown": out_after}))
