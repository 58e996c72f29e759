"""The neighbour collectives of a Cartesian grid (``Cartcomm``): ``neighbor_allgather`` / ``Neighbor_allgather``
(every neighbour's part) and ``neighbor_alltoall`` / ``Neighbor_alltoall`` (a part for each neighbour), and
their nonblocking forms, with MPI's neighbour order: along each dimension, the rank one step back, then the
rank one step on (``inedges``; ``MPI.PROC_NULL`` past an edge that does not wrap, whose block is left as it
was, or None for objects).

Each part travels as a message, in a context of the communicator's own, tagged with the call's kind and with
the place the receiver keeps it in: along a dimension, what a rank sends one step on arrives from the
receiver's step back. So a grid of 2 that wraps, where both neighbours along a dimension are one rank, and a
grid of 1, where they are the rank itself, each get the right parts. A rank's receives from one neighbour
are matched in the order it sent, so consecutive calls never take each other's parts; a neighbour that made
another neighbour collective is named with both calls (``CollectiveMismatchError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.nonblocking import CollectiveRequest, equal_blocks
from popdist.mpi4py.requests import Request
from popdist.mpi4py.specs import ANY_TAG, PROC_NULL, buffer_of
from simipu.fabric.errors import CollectiveMismatchError

if TYPE_CHECKING:
    from popdist.mpi4py.topology import Cartesian

KINDS = ("neighbor_allgather", "neighbor_alltoall", "Neighbor_allgather", "Neighbor_alltoall")
#: In a part's tag: its kind from this bit; below it, the place the receiver keeps it in.
_KIND_SHIFT = 8
#: The contexts of their messages, one for each communicator (apart from those of ``nonblocking``'s, of
#: the blocking collectives and of the point to point).
CONTEXT_BASE = -(1 << 60)


class NeighbourCollectives:
    """``Cartcomm``'s neighbour collectives (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Cartcomm``)
        _grid: Cartesian
        _context: int

        def Get_rank(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _rank_of(self, instance: int) -> int: ...

    # -- the neighbours, as mpi4py's Topocomm gives them ------------------------------------------------------
    @property
    def inedges(self) -> list[int]:
        """Along each dimension, the rank one step back, then one step on (``MPI.PROC_NULL`` past an edge)."""
        me, grid = self.Get_rank(), self._grid
        return [grid.neighbour(me, d, step) for d in range(len(grid.dims)) for step in (-1, 1)]

    outedges = inedges

    @property
    def inoutedges(self) -> tuple[list[int], list[int]]:
        return self.inedges, self.outedges

    @property
    def indegree(self) -> int:
        return 2 * len(self._grid.dims)

    outdegree = indegree

    @property
    def degrees(self) -> tuple[int, int]:
        return self.indegree, self.outdegree

    # -- the collectives --------------------------------------------------------------------------------------
    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        mine = matching.pickled(sendobj)
        return self._objects("neighbor_allgather", [mine] * self.indegree)

    def neighbor_alltoall(self, sendobj: Sequence[Any] | None) -> list[Any]:
        if sendobj is None:  # (None to every neighbour, as mpi4py sends it)
            sendobj = [None] * self.outdegree
        if len(sendobj) != self.outdegree:
            raise ValueError(f"neighbor_alltoall: give a sequence of {self.outdegree} objects, one for each "
                             "neighbour (inedges' order)")
        return self._objects("neighbor_alltoall", [matching.pickled(obj) for obj in sendobj])

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        self.Ineighbor_allgather(sendbuf, recvbuf).Wait()

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        self.Ineighbor_alltoall(sendbuf, recvbuf).Wait()

    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> Request:
        degree = self.indegree
        mine = buffer_of(sendbuf, "Neighbor_allgather").view(np.uint8)
        blocks = equal_blocks(buffer_of(recvbuf, "Neighbor_allgather", receives=True, blocks=degree), degree,
                         "Neighbor_allgather") if degree else []
        return self._buffers("Neighbor_allgather", [mine] * degree, blocks)

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        degree = self.indegree
        what = "Neighbor_alltoall"
        sends = equal_blocks(buffer_of(sendbuf, what, blocks=degree), degree, what) if degree else []
        blocks = equal_blocks(buffer_of(recvbuf, what, receives=True, blocks=degree), degree, what) if degree else []
        return self._buffers(what, [block.view(np.uint8) for block in sends], blocks)

    def _buffers(self, what: str, sends: list[np.ndarray], blocks: list[np.ndarray]) -> Request:
        for block in blocks:
            if block.nbytes != sends[0].nbytes:
                raise ValueError(f"{what}: each neighbour's block of the receive buffer holds {block.nbytes} bytes, "
                                 f"each part sent {sends[0].nbytes}")

        def finish(parts: dict[int, matching.Message]) -> None:
            for place, message in parts.items():
                matching.deliver(blocks[place].view(np.uint8), message, what, self._rank_of(message.source))
        return self._exchange(what, sends, finish)

    def _objects(self, what: str, sends: list[np.ndarray]) -> list[Any]:
        got: list[Any] = [None] * self.indegree

        def finish(parts: dict[int, matching.Message]) -> None:
            for place, message in parts.items():
                got[place] = matching.unpickled(message)
        self._exchange(what, sends, finish).Wait()
        return got

    def _exchange(self, what: str, sends: list[np.ndarray], finish: Callable[[dict[int, matching.Message]], None]
                  ) -> Request:
        """Part k of ``sends`` to neighbour k; a receive from each neighbour; the request that completes when they
        have come, ``finish`` then taking each neighbour's part by its place."""
        neighbours, context, kind = self.inedges, CONTEXT_BASE - self._context, KINDS.index(what)
        present = [place for place, rank in enumerate(neighbours) if rank != PROC_NULL]
        receives = [matching.post(context, [self._instance(neighbours[place], what)], ANY_TAG) for place in present]
        for place in present:  # (what goes one step on arrives from the receiver's step back: place ^ 1)
            matching.send(sends[place], context, kind << _KIND_SHIFT | place ^ 1,
                          self._instance(neighbours[place], what))

        def by_place(messages: list[matching.Message]) -> None:
            parts = {}
            for message in messages:
                theirs = message.tag >> _KIND_SHIFT
                if theirs != kind:
                    raise CollectiveMismatchError(f"{what}: rank {self._rank_of(message.source)} called "
                                                  f"{KINDS[theirs]} where rank {self.Get_rank()} called {what}")
                parts[message.tag & (1 << _KIND_SHIFT) - 1] = message
            finish(parts)
        return CollectiveRequest(receives, by_place, what)
