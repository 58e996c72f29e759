"""Communicators made by splitting COMM_WORLD, as MPI programs find their local rank and their groups
(4 instances on one host): ``Split_type(COMM_TYPE_SHARED)``, ``Split`` by parity, one rank left out
(``MPI.UNDEFINED``: ``COMM_NULL``), and collectives and messages inside each; a freed communicator, and
what may not be freed; a ``Split`` whose keys reverse the ranks' order; communicators' names. Each rank prints
its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}

# keys that reverse the ranks' order: every collective's ranks in that order
backwards = comm.Split(color=0, key=-r)
gathered = np.zeros(n)
backwards.Allgather(np.array([float(r)]), gathered)
prefix = np.zeros(1)
backwards.Scan(np.array([float(r)]), prefix)
out["reversed"] = [backwards.Get_rank(), backwards.allgather(r), gathered.tolist(), float(prefix[0]),
                   backwards.bcast(r, root=0)]

local = comm.Split_type(MPI.COMM_TYPE_SHARED)
out["local"] = [local.Get_rank(), local.Get_size(), local.allreduce(1)]

parity = comm.Split(color=r % 2, key=r)
out["parity"] = [parity.Get_rank(), parity.Get_size(), parity.allgather(r)]
total = np.array([float(r)])
parity.Allreduce(MPI.IN_PLACE, total)
out["parity_sum"] = float(total[0])
# a message inside the split comm, and one in COMM_WORLD with the same tag: each taken by its own communicator
if parity.Get_rank() == 0:
    comm.send(f"world from {r}", dest=(r + 2) % n, tag=7)
    parity.send(f"parity from {r}", dest=1, tag=7)
elif parity.Get_rank() == 1:
    out["parity_message"] = parity.recv(source=0, tag=7)
if parity.Get_rank() == 1:
    out["world_message"] = comm.recv(source=MPI.ANY_SOURCE, tag=7)

left_out = comm.Split(MPI.UNDEFINED if r == n - 1 else 0, key=0)
out["joined"] = bool(left_out)  # (the idiom ``if comm:``: false for COMM_NULL)
if r == n - 1:
    out["left_out"] = left_out == MPI.COMM_NULL
    try:
        left_out.Barrier()
    except MPI.Exception as exc:
        out["null_call"] = exc.Get_error_class() == MPI.ERR_COMM
else:
    out["rest"] = [left_out.Get_size(), left_out.bcast(f"root {r}", root=0)]
copy = comm.Dup()
copy.Free()
out["freed"] = [copy == MPI.COMM_NULL, bool(copy)]
errors = []
for call in (comm.Free, MPI.COMM_NULL.Free, MPI.COMM_NULL.Dup, copy.Barrier):
    try:
        call()
    except MPI.Exception as exc:
        errors.append(exc.Get_error_class() == MPI.ERR_COMM)
out["free_errors"] = errors
out["with_info"] = comm.Split_type(MPI.COMM_TYPE_SHARED, key=r, info=MPI.INFO_NULL).Get_size()
# names as Open MPI's: the predefined ones', "" for one made from them until Set_name; errors still say which
named = comm.Dup()
names = [comm.Get_name(), MPI.COMM_SELF.name, named.Get_name(), parity.Get_name(), comm.Create_cart([n]).name]
try:
    parity.bcast(None, root=5)
except MPI.Exception as exc:
    names.append(str(exc))
named.Set_name("mine")
names += [named.Get_name(), named.Dup().Get_name()]
named.name = "renamed"
names.append(named.name)
out["names"] = names
comm.Barrier()
print(json.dumps(out), flush=True)
