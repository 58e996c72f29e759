"""mpi4py's vector collectives (3 instances): ``Allgatherv`` with the default displacements, with ones of
its own and in place, ``Gatherv`` to rank 1, ``Scatterv`` from rank 2 (a block above the inline size among
them), in each of mpi4py's spec forms, and with the counts left to mpi4py's rules (none: the buffer split
evenly; one int: every rank's count; an int displacement: a stride). Each rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
counts = [k + 1 for k in range(n)]  # rank k gives k + 1 items
mine = np.full(r + 1, float(r))

packed = np.full(sum(counts), -1.0)
comm.Allgatherv(mine, [packed, counts])
out["allgatherv"] = packed.tolist()

spread = np.full(sum(counts) + n, -1.0)  # a gap after each block
displacements = [sum(counts[:k]) + k for k in range(n)]
comm.Allgatherv(mine, [spread, (counts, displacements), MPI.DOUBLE])
out["allgatherv_displaced"] = spread.tolist()

in_place = np.full(sum(counts), -1.0)
in_place[sum(counts[:r]):sum(counts[:r + 1])] = r
comm.Allgatherv(MPI.IN_PLACE, [in_place, counts])
out["allgatherv_in_place"] = in_place.tolist()

gathered = np.full(sum(counts), -1.0) if r == 1 else None
comm.Gatherv(mine, [gathered, counts, None] if r == 1 else None, root=1)
if r == 1:
    out["gatherv"] = gathered.tolist()

even = np.full(n + 1, -1.0)  # (no counts: the first rank gets the one item more)
comm.Allgatherv(np.full(2 if r == 0 else 1, float(r)), [even, MPI.DOUBLE])
out["allgatherv_even"] = even.tolist()
strided = np.full(2 * n, -1.0)
comm.Allgatherv(np.array([float(r)]), [strided, (1, 2), MPI.DOUBLE])  # (count 1 for each, displacement 2 apart)
out["allgatherv_strided"] = strided.tolist()
alike = np.full(2 * n, -1.0)
comm.Allgatherv(np.array([r, r + 0.5]), [alike, 2, MPI.DOUBLE])
out["allgatherv_alike"] = alike.tolist()

sizes = [3, 1, 1 << 14]  # (the last: 128 KiB of float64, above a message's inline size)
source = np.arange(sum(sizes), dtype=np.float64) if r == 2 else None
part = np.full(sizes[r], -1.0)
comm.Scatterv([source, sizes, [sum(sizes[:k]) for k in range(n)], MPI.DOUBLE] if r == 2 else None, part, root=2)
out["scatterv"] = [part.size, float(part[0]), float(part[-1])]
comm.Barrier()
print(json.dumps(out), flush=True)
