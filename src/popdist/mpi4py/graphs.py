"""MPI's graph topologies: ``Comm.Create_dist_graph_adjacent`` and ``Create_dist_graph`` give a
``Distgraphcomm`` (each rank's sources and destinations, in the order given), ``Comm.Create_graph`` a
``Graphcomm`` (MPI's older whole-graph form: each rank's neighbours are both); their neighbour collectives
are ``neighbours``'. Making one is one small allgather, which also finds whether the ranks agree: whether every
edge a rank sends on is one its destination receives on, as many times. A graph on which they do not can be
made and asked about, as MPI's, but a neighbour collective on it raises at once on every rank, where MPI's
would wait for a part that never comes.

Where a rank is a neighbour several times (a multigraph), the parts between two ranks are matched in order:
the k-th part a rank sends another arrives at the k-th place that other lists it, as MPI says.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from popdist.mpi4py.specs import ERR_ARG, MPIException, is_int
from popdist.mpi4py.topology import TopologyMaker

if TYPE_CHECKING:
    from popdist.mpi4py.comm import Comm

#: ``Get_topology``'s answers for these (Open MPI's values).
GRAPH, DIST_GRAPH = 2, 3


class Adjacency:
    """One rank's edges: where its parts come from and go to, in its order, and their weights (None: none);
    ``problem``: why a neighbour collective could not complete on this graph (None: it can)."""

    def __init__(self, sources: Sequence[int], destinations: Sequence[int],
                 weights: tuple[list[int], list[int]] | None = None, problem: str | None = None) -> None:
        self.sources, self.destinations, self.weights = list(sources), list(destinations), weights
        self.problem = problem

    def tag_for(self, k: int) -> int:
        """The tag of the part to destination k: how many parts to that rank come before it."""
        return self.destinations[:k].count(self.destinations[k])

    def place_for(self, source: int, tag: int) -> int:
        """Where the part ``source`` tagged ``tag`` goes: the tag-th place that lists ``source``."""
        return [k for k, s in enumerate(self.sources) if s == source][tag]


def ranks_of(values: Any, size: int, what: str, name: str) -> list[int]:
    """A list of ranks of a communicator of ``size`` (a graph's edges), checked."""
    try:
        ranks: list[Any] | None = list(values)
    except TypeError:
        ranks = None
    if ranks is None or not all(is_int(rank) and 0 <= rank < size for rank in ranks):
        raise MPIException(ERR_ARG, f"{what}: {name} {values!r} is not a list of ranks (0 to {size - 1})")
    return [int(rank) for rank in ranks]


def disagreement(adjacencies: Sequence[tuple[list[int], list[int]]]) -> str | None:
    """Every rank's (sources, destinations): why they disagree (an edge sent on more or fewer times than it is
    received on), or None."""
    sent = Counter((rank, dest) for rank, (_, dests) in enumerate(adjacencies) for dest in dests)
    received = Counter((source, rank) for rank, (sources, _) in enumerate(adjacencies) for source in sources)
    for edge in sorted(set(sent) | set(received)):
        if sent[edge] != received[edge]:
            source, dest = edge
            return (f"rank {source} lists rank {dest} as a destination {sent[edge]} time(s), rank {dest} lists rank "
                    f"{source} as a source {received[edge]} time(s)")
    return None


class GraphMethods:
    """What ``Distgraphcomm`` and ``Graphcomm`` add to ``Comm``."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _adjacency: Adjacency

        def Get_rank(self) -> int: ...

    @property
    def inedges(self) -> list[int]:
        return list(self._adjacency.sources)

    @property
    def outedges(self) -> list[int]:
        return list(self._adjacency.destinations)

    def _tag_for(self, k: int) -> int:
        return self._adjacency.tag_for(k)

    def _place_for(self, source: int, tag: int) -> int:
        return self._adjacency.place_for(source, tag)

    def _neighbour_problem(self) -> str | None:
        return self._adjacency.problem


class DistGraphMethods(GraphMethods):
    """``Distgraphcomm``'s answers (MPI's names)."""

    def Get_topology(self) -> int:
        return DIST_GRAPH

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:
        adjacency = self._adjacency
        return len(adjacency.sources), len(adjacency.destinations), adjacency.weights is not None

    def Get_dist_neighbors(self) -> tuple[list[int], list[int], tuple[list[int], list[int]] | None]:
        adjacency = self._adjacency
        return list(adjacency.sources), list(adjacency.destinations), adjacency.weights


class WholeGraph:
    """``Create_graph``'s graph: every node's neighbours, from MPI's ``index`` and ``edges``."""

    def __init__(self, index: list[int], edges: list[int]) -> None:
        self.index, self.edges = index, edges

    def neighbours(self, node: int) -> list[int]:
        return self.edges[self.index[node - 1] if node else 0:self.index[node]]


class WholeGraphMethods(GraphMethods):
    """``Graphcomm``'s answers (MPI's names, and mpi4py's properties)."""

    if TYPE_CHECKING:
        _graph: WholeGraph

        def _rank_checked(self, root: int, what: str) -> int: ...

    def Get_topology(self) -> int:
        return GRAPH

    def Get_dims(self) -> tuple[int, int]:
        return len(self._graph.index), len(self._graph.edges)

    def Get_topo(self) -> tuple[list[int], list[int]]:
        return list(self._graph.index), list(self._graph.edges)

    def Get_neighbors(self, rank: int) -> list[int]:
        return self._graph.neighbours(self._rank_checked(rank, "Get_neighbors"))

    def Get_neighbors_count(self, rank: int) -> int:
        return len(self.Get_neighbors(rank))

    @property
    def dims(self) -> tuple[int, int]:
        return self.Get_dims()

    @property
    def topo(self) -> tuple[list[int], list[int]]:
        return self.Get_topo()

    @property
    def nnodes(self) -> int:
        return len(self._graph.index)

    @property
    def nedges(self) -> int:
        return len(self._graph.edges)

    @property
    def index(self) -> list[int]:
        return list(self._graph.index)

    @property
    def edges(self) -> list[int]:
        return list(self._graph.edges)

    @property
    def neighbors(self) -> list[int]:
        return self._graph.neighbours(self.Get_rank())

    @property
    def nneighbors(self) -> int:
        return len(self.neighbors)


def whole_graph_of(index: Any, edges: Any, size: int, what: str) -> WholeGraph:
    """``Create_graph``'s arguments checked: ``index`` running sums of the nodes' degrees, ``edges`` their
    neighbours, at most ``size`` nodes."""
    try:
        index_list, edge_list = [int(i) for i in index], [int(e) for e in edges]
    except (TypeError, ValueError):
        raise MPIException(ERR_ARG, f"{what}: index and edges are lists of ints") from None
    if len(index_list) > size or any(b < a for a, b in zip([0, *index_list], index_list)) or \
            (index_list and index_list[-1] != len(edge_list)):
        raise MPIException(ERR_ARG, f"{what}: index {index_list} is not the running sums of at most {size} nodes' "
                                    f"degrees ending at the {len(edge_list)} edges")
    ranks_of(edge_list, len(index_list), what, "edges")
    return WholeGraph(index_list, edge_list)


class GraphConstructors(TopologyMaker):
    """``Comm``'s ``Create_dist_graph_adjacent``, ``Create_dist_graph`` and ``Create_graph``."""

    if TYPE_CHECKING:
        def _graph_comm(self, members: list[int], context: int, adjacency: Adjacency | None,
                        whole: WholeGraph | None) -> Comm: ...

    def Create_dist_graph_adjacent(self, sources: Sequence[int], destinations: Sequence[int],
                                   sourceweights: Sequence[int] | None = None,
                                   destweights: Sequence[int] | None = None, info: Any = None,
                                   reorder: bool = False) -> Comm:
        """A ``Distgraphcomm`` of every rank, each with the sources and destinations it gives, in its order
        (collective: one allgather checks that they agree)."""
        what, size = "Create_dist_graph_adjacent", self.Get_size()
        mine = ranks_of(sources, size, what, "sources"), ranks_of(destinations, size, what, "destinations")
        weights = _weights(sourceweights, destweights, mine, what)
        return self._dist_graph(mine, weights, what)

    def Create_dist_graph(self, sources: Sequence[int], degrees: Sequence[int], destinations: Sequence[int],
                          weights: Sequence[int] | None = None, info: Any = None, reorder: bool = False) -> Comm:
        """A ``Distgraphcomm`` of the edges every rank gives (``sources[i]`` to the next ``degrees[i]`` of
        ``destinations``): each rank's sources and destinations in the order of the ranks that gave them, then
        of their places there. Weights are not provided here (``Create_dist_graph_adjacent`` takes them)."""
        what, size = "Create_dist_graph", self.Get_size()
        if weights is not None:
            raise MPIException(ERR_ARG, f"{what}: weights are not provided by poprun-py's mpi4py here; give them to "
                                        "Create_dist_graph_adjacent")
        starts, ends = ranks_of(sources, size, what, "sources"), ranks_of(destinations, size, what, "destinations")
        counts = [int(d) for d in degrees] if all(is_int(d) and d >= 0 for d in degrees) else None
        if counts is None or len(counts) != len(starts) or sum(counts) != len(ends):
            raise MPIException(ERR_ARG, f"{what}: degrees {list(degrees)!r} must be one count from 0 for each source, "
                                        f"adding up to the {len(ends)} destinations")
        edges = [(start, end) for start, count, first in zip(starts, counts, _running(counts))
                 for end in ends[first:first + count]]
        everyone = self.allgather(edges)
        me = self.Get_rank()
        every_edge = [edge for given in everyone for edge in given]
        mine = [start for start, end in every_edge if end == me], [end for start, end in every_edge if start == me]
        return self._dist_graph(mine, None, what, agreed=True)

    def _dist_graph(self, mine: tuple[list[int], list[int]], weights: tuple[list[int], list[int]] | None, what: str,
                    agreed: bool = False) -> Comm:
        problem = None if agreed else disagreement(self.allgather(mine))
        self._dups += 1
        context = self._derived_context(what)
        members = [self._instance(rank, what) for rank in range(self.Get_size())]
        return self._graph_comm(members, context, Adjacency(*mine, weights, problem), None)

    def Create_graph(self, index: Sequence[int], edges: Sequence[int], reorder: bool = False) -> Comm:
        """A ``Graphcomm`` of the first len(index) ranks, node k's neighbours ``edges[index[k-1]:index[k]]``
        (both its sources and its destinations); the ranks past it get ``MPI.COMM_NULL``."""
        what = "Create_graph"
        graph = whole_graph_of(index, edges, self.Get_size(), what)
        everyone = self.allgather((graph.index, graph.edges))
        if any(given != everyone[0] for given in everyone):
            raise MPIException(ERR_ARG, f"{what}: every rank must give the same index and edges")
        nodes = len(graph.index)
        problem = disagreement([(graph.neighbours(k), graph.neighbours(k)) for k in range(nodes)])
        self._dups += 1
        context = self._derived_context(what)
        me = self.Get_rank()
        if me >= nodes:
            return self._graph_comm([], context, None, graph)  # (MPI.COMM_NULL: this rank is left out)
        neighbours = graph.neighbours(me)
        return self._graph_comm([self._instance(rank, what) for rank in range(nodes)], context,
                                Adjacency(neighbours, neighbours, problem=problem and f"the graph is not symmetric: "
                                          f"{problem}"), graph)


def _running(counts: list[int]) -> list[int]:
    """Where each count's items start."""
    starts, total = [], 0
    for count in counts:
        starts.append(total)
        total += count
    return starts


#: mpi4py's weights that say "none" (``MPI.UNWEIGHTED``) and "none, for no edges" (``MPI.WEIGHTS_EMPTY``).
UNWEIGHTED, WEIGHTS_EMPTY = object(), object()


def _weights(sourceweights: Any, destweights: Any, mine: tuple[list[int], list[int]],
             what: str) -> tuple[list[int], list[int]] | None:
    sourceweights, destweights = (None if w in (UNWEIGHTED, WEIGHTS_EMPTY) else w for w in (sourceweights, destweights))
    if sourceweights is None and destweights is None:
        return None
    weights = list(sourceweights or []), list(destweights or [])
    if len(weights[0]) != len(mine[0]) or len(weights[1]) != len(mine[1]):
        raise MPIException(ERR_ARG, f"{what}: give one weight for each source and each destination")
    return weights
