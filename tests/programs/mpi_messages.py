"""mpi4py's point to point as MPI's standard mode, each result printed as JSON for the test to check (3
instances): a ring where every rank sends first, two ranks that both send first, tags received out of
order, a message to oneself, one larger than a socket's buffer, and a duplicated communicator's."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}

comm.send(f"from {r}", dest=(r + 1) % n, tag=r)
out["ring"] = comm.recv(source=(r - 1) % n)
if r < 2:
    comm.send(r * 10, dest=1 - r)
    out["exchange"] = comm.recv(source=1 - r)
if r == 2:
    comm.send("seven", dest=0, tag=7)
    comm.send("eight", dest=0, tag=8)
elif r == 0:
    status = MPI.Status()
    later = comm.recv(source=2, tag=8, status=status)
    out["tags"] = [later, status.Get_tag(), comm.recv(source=2, tag=7)]
comm.send({"me": r}, dest=r, tag=5)
out["self"] = comm.recv(source=r, tag=5)
large = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
if r == 1:
    comm.Send(large, dest=2, tag=9)
elif r == 2:
    received = np.empty_like(large)
    comm.Recv(received, source=1, tag=9)
    out["large"] = bool(np.array_equal(received, large))
if r == 0:
    MPI.COMM_SELF.Dup()  # the sender alone: the world's next Dup must still agree on every rank
library = comm.Dup()  # its messages are its own: a recv on COMM_WORLD does not take them
if r == 0:
    library.send("on the copy", dest=1, tag=1)
    comm.send("on the world", dest=1, tag=1)
elif r == 1:
    out["contexts"] = [comm.recv(source=0, tag=1), library.recv(source=0, tag=1)]
out["self_dup"] = MPI.COMM_SELF.Dup().Get_size()
comm.Barrier()
print(json.dumps(out), flush=True)
