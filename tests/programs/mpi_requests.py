"""mpi4py's requests and statuses in their corners, each result printed as JSON for the test to check (3
instances): COMM_SELF's status, Get_status until complete, Waitall past a failed request, a failed request
and a completed one as REQUEST_NULL, the empty status of a null request, Status(status), MPI.PROC_NULL in a
non-periodic halo exchange, a rank outside the communicator, a missing class attribute of Request; and
(argv[1], a file path) the first call of rank 0's program being a test() of a message already sent."""

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
flag = sys.argv[1]

# a message sent before the receiver's first call: its first test() sees it (the ranks connect at import)
if r == 1:
    comm.send("early", dest=0, tag=20)
    with open(flag, "w") as f:
        f.write("sent")
elif r == 0:
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        pass  # (rank 1 writes the file once its message is on its way)
    out["first_test"] = list(comm.irecv(source=1, tag=20).test())

status = MPI.Status()
MPI.COMM_SELF.send("me", dest=0, tag=3)
MPI.COMM_SELF.recv(source=MPI.ANY_SOURCE, status=status)
out["self_source"] = status.Get_source()

if r == 1:
    request = comm.irecv(source=0, tag=14)
    while not request.Get_status(status):
        pass
    out["get_status"] = [status.Get_source(), status.Get_tag(), bool(request), request.wait()]
elif r == 0:
    comm.send("fourteen", dest=1, tag=14)

if r == 2:
    comm.Send(np.arange(4, dtype=np.float64), dest=0, tag=15)
    comm.Send(np.arange(2, dtype=np.float64), dest=0, tag=16)
elif r == 0:
    small, fits = np.zeros(2), np.zeros(2)
    requests = [comm.Irecv(small, source=2, tag=15), comm.Irecv(fits, source=2, tag=16)]
    statuses = [MPI.Status(), MPI.Status()]
    try:
        MPI.Request.Waitall(requests, statuses)
    except MPI.Exception as exc:
        out["waitall"] = [exc.Get_error_class() == MPI.ERR_IN_STATUS, fits.tolist(),
                          [s.Get_error() for s in statuses], [bool(q) for q in requests],
                          requests[0] == MPI.REQUEST_NULL]
    null = MPI.Status()
    null.source = 5
    requests[1].Wait(null)
    out["null_status"] = [null.Get_source(), null.Get_tag(), null.Get_count()]
    out["waitany_null"] = MPI.Request.Waitany(requests)
copied = MPI.Status(status)
out["status_copy"] = [copied.Get_source(), copied.Get_tag()] == [status.Get_source(), status.Get_tag()]

# a non-periodic halo exchange: the edges send to and receive from PROC_NULL
left = r - 1 if r > 0 else MPI.PROC_NULL
right = r + 1 if r < n - 1 else MPI.PROC_NULL
halo = np.full(2, -1.0)
comm.Sendrecv(np.array([float(r)]), dest=right, recvbuf=halo[0:1], source=left, status=status)
comm.Sendrecv(np.array([float(r)]), dest=left, recvbuf=halo[1:2], source=right)
out["halo"] = halo.tolist()
out["from_null"] = [comm.recv(source=MPI.PROC_NULL, status=status), status.Get_source(), status.Get_count()]
out["irecv_null"] = comm.irecv(source=MPI.PROC_NULL).wait()

try:
    comm.send("nowhere", dest=n)
except MPI.Exception as exc:
    out["bad_rank"] = exc.Get_error_class() == MPI.ERR_RANK and isinstance(exc, ValueError)
try:
    MPI.Request.Testany  # noqa: B018 - the lookup itself is what is tested
except AttributeError as exc:
    out["missing"] = [type(exc).__name__, str(exc).split(";")[0]]
comm.Barrier()
print(json.dumps(out), flush=True)
