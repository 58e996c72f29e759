"""mpi4py worker: ``comm.Allreduce(x, out, op=MPI.SUM)`` on float32 NumPy arrays, out preallocated
(``comm.Bcast(x, root=0)`` in place; ``comm.Allgather(x, out)``, out preallocated).

Launched as ``mpirun --allow-run-as-root -np N python mpi4py_worker.py ...``.
"""

import time

start = time.perf_counter()
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402  (MPI_Init happens here)

comm = MPI.COMM_WORLD
comm.Barrier()
init_s = time.perf_counter() - start

import _common  # noqa: E402


def allreduce(x: np.ndarray) -> np.ndarray:
    out = _common.preallocated(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    return out


def broadcast(x: np.ndarray) -> np.ndarray:
    comm.Bcast(x, root=0)
    return x


def allgather(x: np.ndarray) -> np.ndarray:
    out = _common.preallocated(x, comm.Get_size())
    comm.Allgather(x, out)
    return out


_common.run(
    tool="mpi4py",
    rank=comm.Get_rank(),
    n=comm.Get_size(),
    allreduce=allreduce,
    broadcast=broadcast,
    allgather=allgather,
    barrier=comm.Barrier,
    gather=comm.allgather,
    init_s=init_s,
    extra={"mpi_library": MPI.Get_library_version().strip().splitlines()[0]},
)
