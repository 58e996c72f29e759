"""mpi4py's pickle-based reductions where the ranks name different ops or roots (2 ranks): each raises
CollectiveMismatchError on every rank, as the buffer methods do; so do the gathers and ``Reduce`` with each rank
its own root; a root that is no rank raises ``MPI.Exception`` with ``MPI.ERR_ROOT`` on every rank; the
communicator works on. Prints one JSON record per rank."""

import json

import numpy as np
from mpi4py import MPI

from simipu.fabric.errors import CollectiveMismatchError

comm = MPI.COMM_WORLD
r = comm.Get_rank()
record: dict = {"rank": r, "size": comm.Get_size()}
calls = {
    "allreduce": lambda: comm.allreduce(r + 1, op=MPI.SUM if r == 0 else MPI.PROD),
    "reduce": lambda: comm.reduce(r + 1, root=r),
    "scan": lambda: comm.scan(r + 1, op=MPI.MAX if r == 0 else MPI.MIN),
    "gather": lambda: comm.gather(r, root=r),
    "Gather": lambda: comm.Gather(np.array([r]), np.zeros(2, int), root=r),
    "Reduce": lambda: comm.Reduce(np.array([r]), np.zeros(1, int), root=r),
}
for name, call in calls.items():
    try:
        record[name] = call()
    except CollectiveMismatchError as exc:
        record[name] = str(exc)
no_root = {
    "gather": lambda root: comm.gather(r, root=root),
    "reduce": lambda root: comm.reduce(r, root=root),
    "Reduce": lambda root: comm.Reduce(np.array([r]), np.zeros(1, int), root=root),
}
for name, call in no_root.items():
    for root in (2, -1):
        try:
            record[f"{name}_root_{root}"] = call(root)
        except MPI.Exception as exc:
            record[f"{name}_root_{root}"] = [str(exc), exc.Get_error_class()]
record["error_classes"] = [[code, MPI.Get_error_string(code).split(":")[0]]
                           for code in (MPI.SUCCESS, MPI.ERR_BUFFER, MPI.ERR_ROOT, MPI.ERR_OTHER)]
record["after"] = comm.allreduce(r + 1, op=MPI.SUM)
print(json.dumps(record), flush=True)
