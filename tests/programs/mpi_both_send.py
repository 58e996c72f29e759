"""Two ranks that both send to each other before receiving: with a synchronous send (poprun-py's, as
MPI_Ssend) that cannot pair up; each rank prints the error it got."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
try:
    comm.send(r, dest=1 - r)
    print(f"rank {r}: received {comm.recv(source=1 - r)}", flush=True)
except Exception as exc:  # noqa: BLE001 - the test checks which
    print(f"rank {r}: {type(exc).__name__}: {exc}", flush=True)
