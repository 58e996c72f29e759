"""poprun-py worker: ``popdist.collectives.allreduce(x, "sum", out=out)`` into a preallocated ``out`` (or
``broadcast(x, 0, out=x)`` in place, ``allgather(x, out=out)`` into a preallocated ``out``: like for like with
the mpi4py worker's ``comm.Allreduce(x, out)``, ``comm.Bcast(x)`` and ``comm.Allgather(x, out)``) on float32
NumPy arrays.

Launched as ``poprun --offline-mode=1 --num-instances N --num-replicas N python poprun_worker.py ...``.
With ``--label poprun-new`` it times the plain ``allreduce(x, "sum")`` instead, a new array each call: the
like for like of the Horovod worker's ``hvd.allreduce(t)``, which returns a new tensor.

With ``--label poprun`` (the allreduce only) it also times the persistent allreduce, ``C.allreduce_init(x,
"sum")`` called each time (MPI 4's ``MPI_Allreduce_init``, which mpi4py on Open MPI 4.1 cannot offer), in
blocks alternating with the call into ``out`` (``_common.run``'s ``paired``): what a program that binds its
buffer once pays. Its callable is looked up in the timed call as ``out`` is (``_common.preallocated``), and its
first result is checked, bit for bit, against the plain call's.
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


_persistent: dict[tuple, tuple[np.ndarray, object]] = {}


def allreduce_persistent(x: np.ndarray) -> np.ndarray:
    """The persistent allreduce bound to ``x``, made (and checked) at its first call."""
    key = (x.shape, x.dtype.str)
    bound = _persistent.get(key)
    if bound is None or bound[0] is not x:
        call = C.allreduce_init(x, "sum")
        if not np.array_equal(call(), C.allreduce(x, "sum")):
            raise SystemExit("poprun worker: the persistent allreduce's result differs from the plain call's")
        bound = _persistent[key] = (x, call)
    return bound[1]()


SIZE = C.size()
LABEL = sys.argv[sys.argv.index("--label") + 1] if "--label" in sys.argv[:-1] else ""


def allgather(x: np.ndarray) -> np.ndarray:
    return C.allgather(x, out=_common.preallocated(x, SIZE))


_common.run(
    tool="poprun",
    rank=C.rank(),
    n=C.size(),
    allreduce=allreduce_new if LABEL == "poprun-new" else allreduce,
    paired=allreduce_persistent if LABEL == "poprun" else None,
    broadcast=lambda x: C.broadcast(x, 0, out=x),
    allgather=allgather,
    barrier=C.barrier,
    gather=gather,
    init_s=init_s,
)
