"""Instance 0 leaves the fabric as its program ends, then holds its exit until the test lets it go.

usage: hold_exit_after_leaving.py {mpi4py,collectives} {raise,exit0}

Instance 0 raises KeyError (or exits 0) before the job's first collective; its
fabric closes at exit, so the others fail of its loss (PeerLostError). Its
``atexit`` handler, registered before the fabric's (so it runs after the
fabric has closed), connects to the Unix socket named by RELEASE_SOCKET,
sends its pid and waits for end-of-file: the test lets it exit only once
poprun has seen a peer fail, an order a loaded machine can produce by chance.
"""

import atexit
import os
import socket
import sys

holding = False


def hold() -> None:
    if not holding:
        return
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)  # (bounded: a test that never answers does not leave it behind)
        sock.connect(os.environ["RELEASE_SOCKET"])
        sock.sendall(f"{os.getpid()}\n".encode())
        sock.recv(1)


atexit.register(hold)  # before the fabric connects (and registers its own): runs after the fabric has closed
api, behaviour = sys.argv[1:3]
if api == "mpi4py":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, barrier = comm.rank, comm.Barrier
else:
    import popdist
    import popdist.collectives as C

    popdist.init()
    rank, barrier = popdist.getInstanceIndex(), C.barrier
if rank == 0:
    holding = True
    if behaviour == "raise":
        raise KeyError("the real bug is on instance 0")
    sys.exit(0)
barrier()
