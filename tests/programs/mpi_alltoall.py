"""mpi4py's all-to-all (3 or more instances): ``alltoall`` of objects, ``Alltoall`` of small and large
blocks, both beside a user's message with the same tag, and on a ``Split`` communicator; ``Alltoall`` and
``Allgather`` with a count in the spec (one rank's, as MPI's); ``Alltoallv`` with blocks of every size; an
``Alltoall`` whose last rank sends larger blocks. Each rank prints its results as JSON. With the argument
``mismatch``, rank 0 calls ``alltoall`` while the others call ``Barrier``; with ``exchange``, rank 0 calls
``Alltoall`` while the others call ``Scatterv``."""

import json
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
if sys.argv[1:] == ["mismatch"]:
    if r == 0:
        comm.alltoall(list(range(n)))
    else:
        comm.Barrier()
    sys.exit(0)
if sys.argv[1:] == ["exchange"]:
    if r == 0:
        comm.Alltoall(np.zeros(n), np.zeros(n))
    else:
        comm.Scatterv(None, np.zeros(1), root=0)
    sys.exit(0)

out = {"rank": r, "size": n}
comm.send(f"user message from {r}", dest=(r + 1) % n, tag=0)  # (tag 0, as the all-to-all's own messages)
out["alltoall"] = comm.alltoall([f"{r}->{k}" for k in range(n)])
for count in (4, 1 << 15):  # (8-byte items: 32 B and 256 KiB blocks)
    send = np.array([[r * 100 + k] * count for k in range(n)], dtype=np.float64)
    recv = np.full_like(send, -1.0)
    comm.Alltoall(send, recv)
    out[f"Alltoall_{count}"] = [sorted(set(row.tolist())) for row in recv]
out["user_message"] = comm.recv(source=(r - 1) % n, tag=0)
counted = np.arange(2 * n + 1, dtype=np.int32) + 100 * r  # (one item more than the spec's count takes)
into = np.full(2 * n + 1, -1, dtype=np.int32)
comm.Alltoall([counted, 2, MPI.INT], [into, 2, MPI.INT])  # (2 items for each rank)
out["Alltoall_counted"] = into.tolist()
into[:] = -1
comm.Allgather([counted, 2, MPI.INT], [into, 2, MPI.INT])
out["Allgather_counted"] = into.tolist()
def count(source, dest):  # (rank 0's block for the last rank above a message's inline size)
    return source + dest + 1 + (20000 if (source, dest) == (0, n - 1) else 0)


sends = [count(r, k) for k in range(n)]
varied = np.concatenate([np.full(c, r * 100.0 + k) for k, c in enumerate(sends)])
takes = [count(k, r) for k in range(n)]
places = [sum(takes[:k]) + k for k in range(n)]  # (a gap of one item after each block)
gathered = np.full(sum(takes) + n, -1.0)
comm.Alltoallv([varied, sends], [gathered, takes, places, MPI.DOUBLE])
out["Alltoallv"] = [sorted(set(gathered[at:at + c].tolist())) + [c] for at, c in zip(places, takes)]
out["Alltoallv_gaps"] = [gathered[at + c] for at, c in zip(places, takes)]
larger = 2 if r == n - 1 else 1
try:
    comm.Alltoall(np.zeros(n * larger), np.zeros(n * larger))
    out["truncated"] = None
except MPI.Exception as exc:
    out["truncated"] = str(exc)
half = comm.Split(color=r % 2, key=r)
out["split"] = half.alltoall([(r, k) for k in range(half.Get_size())])
comm.Barrier()
print(json.dumps(out), flush=True)
