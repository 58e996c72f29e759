"""poprun-py worker: ``popdist.collectives.allreduce(x, "sum", out=out)`` into a preallocated ``out`` (or
``broadcast(x, 0, out=x)`` in place, ``allgather(x, out=out)`` into a preallocated ``out``: like for like with
the mpi4py worker's ``comm.Allreduce(x, out)``, ``comm.Bcast(x)`` and ``comm.Allgather(x, out)``) on float32
NumPy arrays.

Launched as ``poprun --offline-mode=1 --num-instances N --num-replicas N python poprun_worker.py ...``.
With ``--label poprun-new`` it times the plain ``allreduce(x, "sum")`` instead, a new array each call: the
like for like of the Horovod worker's ``hvd.allreduce(t)``, which returns a new tensor.
"""

import sys
import time

start = time.perf_counter()
import numpy as np  # noqa: E402

import popdist  # noqa: E402
import popdist.collectives as C  # noqa: E402

popdist.init()
C.barrier()  # the fabric is connected on every instance
init_s = time.perf_counter() - start

import _common  # noqa: E402


def gather(obj):
    """Everyone's object, in instance order, through the fabric (JSON inside a uint8 array)."""
    import json

    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    sizes = C.allgather(np.array([data.size], dtype=np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), dtype=np.uint8)
    padded[:data.size] = data
    rows = C.allgather(padded)
    return [json.loads(rows[r, :int(sizes[r])].tobytes()) for r in range(len(sizes))]


def allreduce(x: np.ndarray) -> np.ndarray:
    return C.allreduce(x, "sum", out=_common.preallocated(x))


def allreduce_new(x: np.ndarray) -> np.ndarray:
    return C.allreduce(x, "sum")


SIZE = C.size()


def allgather(x: np.ndarray) -> np.ndarray:
    return C.allgather(x, out=_common.preallocated(x, SIZE))


_common.run(
    tool="poprun",
    rank=C.rank(),
    n=C.size(),
    allreduce=allreduce_new if "poprun-new" in sys.argv else allreduce,  # (``--label poprun-new``)
    broadcast=lambda x: C.broadcast(x, 0, out=x),
    allgather=allgather,
    barrier=C.barrier,
    gather=gather,
    init_s=init_s,
)
