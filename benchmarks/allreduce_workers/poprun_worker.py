"""poprun-py worker: ``popdist.collectives.allreduce(x, "sum", out=out)`` into a preallocated ``out`` (or
``broadcast(x, 0, out=x)`` in place, ``allgather(x, out=out)`` into a preallocated ``out``: like for like with
the mpi4py worker's ``comm.Allreduce(x, out)``, ``comm.Bcast(x)`` and ``comm.Allgather(x, out)``) on float32
NumPy arrays.

Launched as ``poprun --offline-mode=1 --num-instances N --num-replicas N python poprun_worker.py ...``.
"""

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


_out: dict[tuple, np.ndarray] = {}


def _out_for(x: np.ndarray, rows: int) -> np.ndarray:
    """The preallocated result for ``x``: ``rows`` of its shape (made once per shape, outside the timing)."""
    out = _out.get((rows, x.shape, x.dtype.str))
    if out is None:
        out = _out[(rows, x.shape, x.dtype.str)] = np.empty((rows, *x.shape), dtype=x.dtype)
    return out


def allreduce(x: np.ndarray) -> np.ndarray:
    return C.allreduce(x, "sum", out=_out_for(x, 1)[0])


def allgather(x: np.ndarray) -> np.ndarray:
    return C.allgather(x, out=_out_for(x, C.size()))


_common.run(
    tool="poprun",
    rank=C.rank(),
    n=C.size(),
    allreduce=allreduce,
    broadcast=lambda x: C.broadcast(x, 0, out=x),
    allgather=allgather,
    barrier=C.barrier,
    gather=gather,
    init_s=init_s,
)
