"""Messages sent before collectives and received after them, as MPI buffers them (3 instances): rank 0 sends
rank 1 a small and an 8 MiB message, then every rank runs a barrier, small and large allreduces, a broadcast
and an allgather (the boards' paths, shared memory and the links), and only then rank 1 receives both; an
Isend/Irecv pair with a barrier between post and wait. Each rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: more than the link holds, so the send waits for room
if r == 0:
    comm.send({"small": True}, dest=1, tag=1)
    comm.Send(big, dest=1, tag=2)
comm.Barrier()
out["allreduce"] = comm.allreduce(r)
out["Allreduce_small"] = float(comm.allreduce(np.full(16, float(r)))[0])
large = np.full(1 << 18, float(r))  # 2 MiB: shared memory
comm.Allreduce(MPI.IN_PLACE, large)
out["Allreduce_large"] = float(large[0])
out["bcast"] = comm.bcast(f"root {r}", root=n - 1)
out["allgather"] = comm.allgather(r)
if r == 1:
    out["received"] = comm.recv(source=0, tag=1)
    got = np.empty_like(big)
    comm.Recv(got, source=0, tag=2)
    out["received_big"] = bool(np.array_equal(got, big))
# a receive posted, a collective, then its wait
request = comm.irecv(source=(r - 1) % n, tag=3)
comm.isend(r, dest=(r + 1) % n, tag=3)
comm.Barrier()
out["ring_after_barrier"] = request.wait()
comm.Barrier()
print(json.dumps(out), flush=True)
