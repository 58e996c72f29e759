"""torch.distributed (gloo) worker: ``dist.all_reduce(t)`` in place on a CPU float32 tensor.

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


def gather(obj):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


_common.run(
    tool="gloo",
    rank=dist.get_rank(),
    n=dist.get_world_size(),
    allreduce=allreduce,
    barrier=dist.barrier,
    gather=gather,
    init_s=init_s,
    timed_input=np.zeros_like,  # reduced in place: zeros stay zeros, any other data grows every call
    extra={"torch": torch.__version__},
)
dist.destroy_process_group()  # without it, gloo sometimes aborts at exit ("terminate called without an active exception")
