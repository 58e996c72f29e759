"""mpi4py's COMM_WORLD inside ``popdist.execute_on_instances`` (4 instances): its buffer methods span the group,
as its pickle-based ones and ``popdist.collectives`` do. Prints one JSON record per rank."""

import json

import numpy as np
from mpi4py import MPI

import popdist.collectives as C
from popdist import execute_on_instances

comm = MPI.COMM_WORLD
r = comm.Get_rank()
pair = (0, 1) if r < 2 else (2, 3)


def in_pair() -> dict:
    out = np.zeros(1)
    comm.Allreduce(np.array([10.0 ** r]), out, op=MPI.SUM)
    rows = np.zeros((2, 1))
    comm.Allgather(np.array([float(r)]), rows)
    value = np.array([float(r)])
    comm.Bcast(value, root=pair[1])
    return {"Allreduce": out[0], "allreduce": comm.allreduce(10.0 ** r), "C": float(C.allreduce(np.array([10.0 ** r]))[0]),
            "Allgather": rows.ravel().tolist(), "Bcast": value[0]}


def alone() -> float:
    out = np.zeros(1)
    comm.Allreduce(np.array([10.0 ** r]), out, op=MPI.SUM)
    return float(out[0])


record = {"rank": r, "size": comm.Get_size(), "pair": execute_on_instances(pair, in_pair),
          "alone": execute_on_instances({r}, alone)}
# rank 1 reduces alone while rank 0 waits for its message (before: a false mismatch with rank 0's receive)
if r == 1:
    execute_on_instances({1}, alone)
    comm.send("after", dest=0)
elif r == 0:
    record["heard"] = comm.recv(source=1)
comm.Barrier()
print(json.dumps(record), flush=True)
