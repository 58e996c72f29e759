"""A receive from any source while every other rank waits in a barrier: no message can come (with MPI, a
hang). Here every rank raises, naming what happened; each prints the error it got (3 instances)."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
try:
    if r == 0:
        comm.recv(source=MPI.ANY_SOURCE)
    comm.Barrier()
    print(f"rank {r}: no error", flush=True)
except Exception as exc:  # noqa: BLE001 - the test checks which
    print(f"rank {r}: {type(exc).__name__}: {exc}", flush=True)
