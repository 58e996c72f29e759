"""mpi4py's all-to-all (3 or more instances): ``alltoall`` of objects, ``Alltoall`` of small and large
blocks, both beside a user's message with the same tag, and on a ``Split`` communicator. Each rank prints its
results as JSON. With the argument ``mismatch``, rank 0 calls ``alltoall`` while the others call ``Barrier``."""

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

out = {"rank": r, "size": n}
comm.send(f"user message from {r}", dest=(r + 1) % n, tag=0)  # (tag 0, as the all-to-all's own messages)
out["alltoall"] = comm.alltoall([f"{r}->{k}" for k in range(n)])
for count in (4, 1 << 15):  # (8-byte items: 32 B and 256 KiB blocks)
    send = np.array([[r * 100 + k] * count for k in range(n)], dtype=np.float64)
    recv = np.full_like(send, -1.0)
    comm.Alltoall(send, recv)
    out[f"Alltoall_{count}"] = [sorted(set(row.tolist())) for row in recv]
out["user_message"] = comm.recv(source=(r - 1) % n, tag=0)
half = comm.Split(color=r % 2, key=r)
out["split"] = half.alltoall([(r, k) for k in range(half.Get_size())])
comm.Barrier()
print(json.dumps(out), flush=True)
