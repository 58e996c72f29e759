"""mpi4py's buffers as MPI reads and writes them, in memory order, each result printed as JSON for the test
to check (3 instances): Fortran-ordered arrays, ``[buffer, count, datatype]``, a receive buffer larger or
shaped otherwise than the message, a read-only buffer at a broadcast's root, ``IN_PLACE`` in Allgather and
Gather, a torch tensor, and the errors for what MPI refuses."""

import json

import numpy as np
import torch
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}

fortran = np.full((2, 3), r + 1.0).T  # (3, 2), Fortran-ordered: written in place, not into a copy
comm.Allreduce(MPI.IN_PLACE, fortran, op=MPI.SUM)
out["fortran_allreduce"] = fortran.tolist()
ordered = np.asfortranarray(np.arange(6.0).reshape(2, 3)) if r == 1 else np.zeros((2, 3), order="F")
comm.Bcast(ordered, root=1)
out["fortran_bcast"] = ordered.tolist()

counted = np.full(4, float(r))
comm.Bcast([counted, 2, MPI.DOUBLE], root=0)  # the first two items only
out["count_spec"] = counted.tolist()

read_only = np.arange(3.0) if r == 2 else np.zeros(3)
read_only.flags.writeable = r != 2  # (the root only reads its buffer: read-only there is fine)
comm.Bcast(read_only, root=2)
message = bytearray(4) if r else b"abcd"
comm.Bcast(message, root=0)
out["read_only_root"] = [read_only.tolist(), bytes(message).decode()]

if r == 0:
    comm.Send(np.arange(3.0), dest=1, tag=1)
    comm.Send(np.arange(6.0), dest=1, tag=2)
    comm.Send(np.arange(5.0), dest=1, tag=3)
elif r == 1:
    larger, status = np.full(5, -1.0), MPI.Status()
    comm.Recv(larger, source=0, tag=1, status=status)
    out["recv_larger"] = [larger.tolist(), status.Get_count(MPI.DOUBLE), status.Get_count(), status.Get_error()]
    shaped = np.zeros((2, 3))
    comm.Recv(shaped, source=0, tag=2)
    out["recv_shaped"] = shaped.tolist()
    try:
        comm.Recv(np.frombuffer(bytes(40)), source=0, tag=3)
    except BufferError as exc:  # (read-only: refused before the message is taken)
        out["read_only"] = str(exc)
    try:
        comm.Recv(np.zeros(2), source=0, tag=3)
    except MPI.Exception as exc:
        out["truncated"] = [str(exc), exc.Get_error_code() == MPI.ERR_TRUNCATE]
    try:
        comm.send("x", dest=0, tag=-2)
    except MPI.Exception as exc:
        out["bad_tag"] = [str(exc), exc.Get_error_code() == MPI.ERR_TAG]

gathered = np.full(n, -1.0)
gathered[r] = 10.0 * r
comm.Allgather(MPI.IN_PLACE, gathered)
out["allgather_in_place"] = gathered.tolist()
if r == 2:
    at_root = np.full((n, 2), -1.0)
    at_root[2] = [2.0, 2.5]
    comm.Gather(MPI.IN_PLACE, at_root, root=2)
    out["gather_in_place"] = at_root.tolist()
else:
    comm.Gather(np.array([float(r), r + 0.5]), None, root=2)

tensor = torch.full((3,), float(r + 1))  # through DLPack, as mpi4py 4 takes it
comm.Allreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)
out["torch"] = tensor.tolist()

strided = np.zeros((3, 3))[:, :2]
try:
    comm.Allreduce(MPI.IN_PLACE, strided, op=MPI.SUM)
except BufferError as exc:
    out["not_contiguous"] = str(exc)
try:
    comm.Alltoallw(np.zeros(3), np.zeros(3))
except AttributeError as exc:
    out["alltoallw"] = [type(exc).__name__, str(exc)]
comm.Barrier()
print(json.dumps(out), flush=True)
