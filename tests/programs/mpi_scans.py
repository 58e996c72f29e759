"""mpi4py's prefix reductions (3 instances): ``scan``/``exscan`` of objects (the default sum, and MAX),
``Scan``/``Exscan`` of buffers (and ``Scan`` in place); the lowercase calls' results are never the caller's
own object, as mpi4py's are not. Each rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
out["scan"] = comm.scan(r + 1)
out["scan_max"] = comm.scan(10 - r, op=MPI.MAX)
out["exscan"] = comm.exscan(r + 1)
mine = np.array([r + 1.0, 2.0 * r])
total = np.full(2, -1.0)
comm.Scan(mine, total)
out["Scan"] = total.tolist()
before = np.full(2, -1.0)
comm.Exscan(mine, before, op=MPI.PROD)
out["Exscan_prod"] = before.tolist()
in_place = mine.copy()
comm.Scan(MPI.IN_PLACE, in_place)
out["Scan_in_place"] = in_place.tolist()
mutable = [r]
out["own_object"] = [comm.scan(mutable, op=MPI.MAX) is mutable, comm.allreduce(mutable, op=MPI.MAX) is mutable,
                     comm.allgather(mutable)[r] is mutable, comm.bcast(mutable, root=0) is mutable]
print(json.dumps(out), flush=True)
