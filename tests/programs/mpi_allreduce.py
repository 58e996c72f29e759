"""mpi4py's allreduce of rank + 1: 3 over two ranks, 6 over three."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
buffer = np.array([comm.rank + 1.0], dtype=np.float64)
comm.Allreduce(MPI.IN_PLACE, [buffer, MPI.DOUBLE], op=MPI.SUM)
print(f"rank {comm.rank} of {comm.size}: allreduce {total} Allreduce {buffer[0]} ({MPI.__name__})")
