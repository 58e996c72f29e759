"""Rank 0 sends to rank 1 and then allreduces; rank 1 allreduces before it receives. MPI buffers the message;
poprun-py's fabric delivers a message before any later frame between the two, so rank 1's allreduce meets
it: each rank prints the error it got."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
try:
    if r == 0:
        comm.send("early", dest=1)
        comm.allreduce(r)
    else:
        comm.allreduce(r)
        comm.recv(source=0)
    print(f"rank {r}: no error", flush=True)
except Exception as exc:  # noqa: BLE001 - the test checks which
    print(f"rank {r}: {type(exc).__name__}: {exc}", flush=True)
