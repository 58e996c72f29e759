"""Rank 1 calls ``Abort`` with the code given as the first argument; the others wait in a barrier (3 instances)."""

import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.Abort(int(sys.argv[1]))
comm.Barrier()
print(f"rank {comm.rank} passed the barrier", flush=True)
