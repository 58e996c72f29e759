"""torch.distributed (gloo) worker: ``dist.all_reduce(t)`` in place on a CPU float32 tensor
(``dist.broadcast(t, src=0)`` in place; ``dist.all_gather(rows, t)`` into views of one preallocated array).

Launched as ``torchrun --standalone --nproc-per-node N gloo_worker.py ...`` (which
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). The tensor shares memory
with the NumPy array the common loop hands over, so no copy is timed.
"""

import time

start = time.perf_counter()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.barrier()
init_s = time.perf_counter() - start

import _common  # noqa: E402

_last: list = [None, None]  # the last array reduced, and the tensor sharing its memory


def allreduce(x: np.ndarray) -> np.ndarray:
    """Sum ``x`` in place across ranks; the tensor wrapping ``x`` is made once per array, not per call."""
    if _last[0] is not x:
        _last[:] = [x, torch.from_numpy(x)]
    dist.all_reduce(_last[1], op=dist.ReduceOp.SUM)
    return x


def _tensor(x: np.ndarray):
    if _last[0] is not x:
        _last[:] = [x, torch.from_numpy(x)]
    return _last[1]


def broadcast(x: np.ndarray) -> np.ndarray:
    dist.broadcast(_tensor(x), src=0)
    return x


_gathered: dict[tuple, tuple[np.ndarray, list]] = {}


def allgather(x: np.ndarray) -> np.ndarray:
    """Every rank's ``x`` into the rows of one array made once per shape (gloo's all_gather takes a list)."""
    key = (x.shape, x.dtype.str)
    if key not in _gathered:
        out = np.empty((dist.get_world_size(), *x.shape), dtype=x.dtype)
        _gathered[key] = (out, list(torch.from_numpy(out).unbind(0)))
    out, rows = _gathered[key]
    dist.all_gather(rows, _tensor(x))
    return out


def gather(obj):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


_common.run(
    tool="gloo",
    rank=dist.get_rank(),
    n=dist.get_world_size(),
    allreduce=allreduce,
    broadcast=broadcast,
    allgather=allgather,
    barrier=dist.barrier,
    gather=gather,
    init_s=init_s,
    timed_input=np.zeros_like,  # reduced in place: zeros stay zeros, any other data grows every call
    extra={"torch": torch.__version__},
)
dist.destroy_process_group()  # without it, gloo sometimes aborts at exit ("terminate called without an active exception")
