"""mpi4py's neighbour collectives on a Cartesian grid (4 instances): a 2 x 2 grid that wraps in its first
dimension (where both neighbours along it are one rank), a ring of 4, a ring of 2 and one of 1 (the rank
itself); objects and buffers, blocking and nonblocking, the blocks of ``MPI.PROC_NULL`` neighbours left as
they were. The expected values are what Open MPI 4.1 with mpi4py 4 gave for these calls. Each rank prints
its results as JSON. With the argument ``mismatch``, rank 0 calls ``neighbor_allgather`` on a ring where the
others call ``neighbor_alltoall``."""

import json
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
if sys.argv[1:] == ["mismatch"]:
    ring = comm.Create_cart([n], periods=[True])
    ring.neighbor_allgather(r) if r == 0 else ring.neighbor_alltoall([r, r])
    sys.exit(0)
cart = comm.Create_cart([2, 2], periods=[True, False])
out["edges"] = [cart.inedges, cart.outedges, list(cart.degrees), cart.indegree, cart.outdegree]
out["objects"] = [cart.neighbor_allgather(r * 10), cart.neighbor_alltoall([f"{r}->{k}" for k in range(4)])]
gathered = np.full(8, -1, np.int32)
cart.Neighbor_allgather(np.array([r, r * 10], np.int32), gathered)
exchanged = np.full(4, -1, np.int32)
cart.Neighbor_alltoall(np.array([100 * r + k for k in range(4)], np.int32), exchanged)
later = np.full(8, -1, np.int32)
request = cart.Ineighbor_allgather(np.array([r, r * 10], np.int32), later)
out["before_wait"] = cart.neighbor_allgather(r)  # (another call while the first is on its way)
request.Wait()
out["buffers"] = [gathered.tolist(), exchanged.tolist(), later.tolist()]
request = cart.Ineighbor_allgather(np.array([r, r * 10], np.int32), later)
comm.Barrier()  # (every part has come: one Test completes the request, as Open MPI's does)
out["test_after_barrier"] = request.Test()
request.Wait()
ring = comm.Create_cart([n], periods=[True])
out["ring"] = ring.neighbor_alltoall([f"{r}->left", f"{r}->right"])
two = comm.Create_cart([2], periods=[True])
if two != MPI.COMM_NULL:
    out["two"] = [two.neighbor_alltoall([f"{r}->left", f"{r}->right"]), two.neighbor_allgather(r)]
one = comm.Create_cart([1], periods=[True])
if one != MPI.COMM_NULL:
    out["one"] = one.neighbor_alltoall(["L", "R"])
print(json.dumps(out), flush=True)
