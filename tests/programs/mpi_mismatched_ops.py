"""mpi4py's pickle-based reductions where the ranks name different ops or roots (2 ranks): each raises
CollectiveMismatchError on every rank, as the buffer methods do; the communicator works on. Prints one JSON
record per rank."""

import json

from mpi4py import MPI

from simipu.fabric.errors import CollectiveMismatchError

comm = MPI.COMM_WORLD
r = comm.Get_rank()
record: dict = {"rank": r, "size": comm.Get_size()}
calls = {
    "allreduce": lambda: comm.allreduce(r + 1, op=MPI.SUM if r == 0 else MPI.PROD),
    "reduce": lambda: comm.reduce(r + 1, root=r),
    "scan": lambda: comm.scan(r + 1, op=MPI.MAX if r == 0 else MPI.MIN),
}
for name, call in calls.items():
    try:
        record[name] = call()
    except CollectiveMismatchError as exc:
        record[name] = str(exc)
record["after"] = comm.allreduce(r + 1, op=MPI.SUM)
print(json.dumps(record), flush=True)
