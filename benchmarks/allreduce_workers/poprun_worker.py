"""poprun-py worker: ``popdist.collectives.allreduce(x, "sum")`` (or ``broadcast(x, 0)``, ``allgather(x)``)
on float32 NumPy arrays.

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


_common.run(
    tool="poprun",
    rank=C.rank(),
    n=C.size(),
    allreduce=lambda x: C.allreduce(x, "sum"),
    broadcast=lambda x: C.broadcast(x, 0),
    allgather=C.allgather,
    barrier=C.barrier,
    gather=gather,
    init_s=init_s,
)
