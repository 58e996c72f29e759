"""mpi4py's Cartesian topology (4 instances): ``Create_cart`` of a 2 x 2 grid periodic in its first dimension,
its coordinates, ranks and shifts (``MPI.PROC_NULL`` past the edge that does not wrap), ``Sub`` of its rows, a
halo exchange of arrays with ``Sendrecv`` along both dimensions, a 1-D ring, a grid of 3 (the fourth rank
gets ``MPI.COMM_NULL``). The expected values are what Open MPI 4.1 with mpi4py 4 gave for these calls. Each
rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
dims = MPI.Compute_dims(n, 2)
cart = comm.Create_cart(dims, periods=[True, False], reorder=False)
out["grid"] = [type(cart).__name__, cart.Get_topology() == MPI.CART, comm.Get_topology() == MPI.UNDEFINED,
               cart.Get_dim(), cart.dims, cart.periods, cart.coords, list(cart.Get_topo())]
out["coords"] = [cart.Get_coords(k) for k in range(n)]
out["ranks"] = [cart.Get_cart_rank([1, 0]), cart.Get_cart_rank((3, 1)), cart.Get_cart_rank([-1, 1])]
out["shifts"] = [list(cart.Shift(0, 1)), list(cart.Shift(1, 1)), list(cart.Shift(1, -1)), list(cart.Shift(0, 3))]
try:
    cart.Get_cart_rank([0, 2])
except MPI.Exception as exc:
    out["off_grid"] = exc.Get_error_code() == MPI.ERR_ARG
row = cart.Sub([False, True])
out["row"] = [type(row).__name__, row.Get_size(), row.Get_rank(), row.dims, row.periods, row.coords, row.allgather(r)]

# a halo exchange: each rank sends its edge values to its neighbours along each dimension and takes theirs
mine = np.full(2, float(r))
halo = []
for direction in (0, 1):
    source, dest = cart.Shift(direction, 1)
    got = np.full(2, -1.0)
    cart.Sendrecv(mine, dest=dest, recvbuf=got, source=source)
    halo.append(got.tolist())
out["halo"] = halo
ring = comm.Create_cart([n], periods=[True])
out["ring"] = [list(ring.Shift(0, 1)), ring.sendrecv(r, dest=ring.Shift(0, 1)[1], source=ring.Shift(0, 1)[0])]
three = comm.Create_cart([3])
out["three"] = three == MPI.COMM_NULL if r == 3 else [three.Get_size(), three.coords]
if r == 3:  # (a grid's call on the rank left out of it)
    try:
        three.Shift(0, 1)
    except MPI.Exception as exc:
        out["left_out"] = exc.Get_error_code() == MPI.ERR_COMM
copy = cart.Dup()
out["dup"] = [type(copy).__name__, copy.coords, copy.allreduce(1)]
try:
    comm.Create_cart([n + 1])
except MPI.Exception as exc:
    out["too_large"] = exc.Get_error_code() == MPI.ERR_ARG
print(json.dumps(out), flush=True)
