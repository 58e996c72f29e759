"""mpi4py's graph topologies (4 instances): a distributed graph where each rank receives twice from the rank
before it (a multigraph: parts matched in order), with and without weights, an empty one, ones made by
``Create_dist_graph`` from the edges one rank or every rank gives, a ``Create_graph`` graph; their neighbour
collectives, objects and buffers, blocking and nonblocking; a graph whose ranks disagree. The expected values
are what Open MPI 4.1 with mpi4py 4 gave for these calls. Each rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
before, after = (r - 1) % n, (r + 1) % n
graph = comm.Create_dist_graph_adjacent([before, after, before], [after, before, after])
out["adjacent"] = [type(graph).__name__, graph.Get_topology() == MPI.DIST_GRAPH, list(graph.Get_dist_neighbors()),
                   list(graph.Get_dist_neighbors_count()), graph.inedges, graph.outedges, list(graph.degrees),
                   graph.is_topo, comm.is_topo]
exchanged = np.full(3, -1, np.int32)
graph.Neighbor_alltoall(np.array([10 * r + k for k in range(3)], np.int32), exchanged)
later = np.full(3, -1, np.int32)
graph.Ineighbor_alltoall(np.array([10 * r + k for k in range(3)], np.int32), later).Wait()
out["parts"] = [graph.neighbor_allgather(r), graph.neighbor_alltoall([f"{r}#{k}" for k in range(3)]),
                exchanged.tolist(), later.tolist()]
weighted = comm.Create_dist_graph_adjacent([before, after, before], [after, before, after],
                                           sourceweights=[1, 2, 3], destweights=[4, 5, 6])
unweighted = comm.Create_dist_graph_adjacent([before], [after], MPI.UNWEIGHTED, MPI.UNWEIGHTED)
empty = comm.Create_dist_graph_adjacent([], [])
out["weights"] = [list(weighted.Get_dist_neighbors()), list(weighted.Get_dist_neighbors_count()),
                  list(unweighted.Get_dist_neighbors_count()), list(empty.Get_dist_neighbors()),
                  empty.neighbor_allgather(r)]
star = comm.Create_dist_graph(*([list(range(n)), [n - 1] + [1] * (n - 1), list(range(1, n)) + [0] * (n - 1)]
                                if r == 0 else [[], [], []]))
out["star"] = [list(star.Get_dist_neighbors()), star.neighbor_allgather(r)]
skips = comm.Create_dist_graph([r], [2], [(r + 2) % n, (r + 1) % n])
out["skips"] = [list(skips.Get_dist_neighbors()), skips.neighbor_allgather(r)]
whole = comm.Create_graph([2, 3, 4, 6], [1, 3, 0, 3, 0, 2])
out["whole"] = [type(whole).__name__, whole.Get_topology() == MPI.GRAPH, list(whole.Get_dims()),
                list(whole.Get_topo()), whole.Get_neighbors(r), whole.Get_neighbors_count(r), whole.nnodes,
                whole.nedges, whole.neighbors, whole.nneighbors, whole.inedges,
                whole.neighbor_allgather(r), whole.neighbor_alltoall([f"{r}#{k}" for k in range(whole.nneighbors)])]
lopsided = comm.Create_dist_graph_adjacent([] if r == 1 else [before], [after])  # (rank 1 takes nothing from 0)
try:
    lopsided.neighbor_allgather(r)
except MPI.Exception as exc:  # (poprun-py's, on every rank; Open MPI's waits forever)
    out["lopsided"] = [exc.Get_error_code() == MPI.ERR_TOPOLOGY, str(exc)]
print(json.dumps(out), flush=True)
