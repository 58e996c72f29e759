"""Horovod-API worker: ``hvd.allreduce(t, op=hvd.Sum)`` on float32 CPU torch tensors, under poprun (where
``import horovod.torch`` is poprun-py's, over the same fabric as ``poprun_worker.py``).

Launched as ``poprun --offline-mode=1 --num-instances N --num-replicas N python hvd_worker.py ...``.
The timed loop reduces a tensor made once from the loop's NumPy array (``timed_input``: ``torch.from_numpy``
shares its memory), so the timed call is Horovod's path alone: tensor in, new tensor out. The checks outside
the timing hand NumPy arrays, which are wrapped the same way. The plain ``popdist.collectives.allreduce``
on the tensor's NumPy array is timed too, in blocks alternating with ``hvd.allreduce``'s (``_common.run``'s
``paired``): hvd's like for like, in the same processes at the same moments.
"""

import time

start = time.perf_counter()
import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

hvd.init()
hvd.allreduce(torch.zeros(1))  # the fabric is connected on every instance (as the poprun worker's barrier)
init_s = time.perf_counter() - start

import _common  # noqa: E402

import popdist.collectives as C  # noqa: E402  (the barrier)


def allreduce(x):
    """``hvd.allreduce`` of a tensor (the timed loop's) or of a NumPy array (the checks'), as a tensor."""
    return hvd.allreduce(x if isinstance(x, torch.Tensor) else torch.from_numpy(x), op=hvd.Sum)


_common.run(
    tool="hvd",
    rank=hvd.rank(),
    n=hvd.size(),
    allreduce=allreduce,
    timed_input=torch.from_numpy,
    paired=lambda array: C.allreduce(array, "sum"),
    barrier=C.barrier,
    gather=hvd.allgather_object,
    init_s=init_s,
)
