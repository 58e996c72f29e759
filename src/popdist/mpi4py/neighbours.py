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
from popdist.mpi4py.specs import ANY_TAG, ERR_TOPOLOGY, PROC_NULL, MPIException, buffer_of
from simipu.fabric.errors import CollectiveMismatchError

if TYPE_CHECKING:
    pass

KINDS = ("neighbor_allgather", "neighbor_alltoall", "Neighbor_allgather", "Neighbor_alltoall")
#: In a part's tag: its kind from this bit; below it, the place the receiver keeps it in.
_KIND_SHIFT = 8
#: The contexts of their messages, one for each communicator (apart from those of ``nonblocking``'s, of
#: the blocking collectives and of the point to point).
CONTEXT_BASE = -(1 << 60)


class NeighbourCollectives:
    """``Topocomm``'s neighbour collectives (see the module docstring); the topology gives the neighbours
    (``inedges``: where parts come from, ``outedges``: where they go) and how a part is tagged (``_tag_for``) and
    placed (``_place_for``)."""

    if TYPE_CHECKING:  # (what they use of the topology's communicator)
        _context: int

        @property
        def inedges(self) -> list[int]: ...
        @property
        def outedges(self) -> list[int]: ...
        def _tag_for(self, k: int) -> int: ...
        def _place_for(self, source: int, tag: int) -> int: ...
        def _neighbour_problem(self) -> str | None: ...
        def Get_rank(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _rank_of(self, instance: int) -> int: ...

    @property
    def is_topo(self) -> bool:
        return True

    @property
    def inoutedges(self) -> tuple[list[int], list[int]]:
        return self.inedges, self.outedges

    @property
    def indegree(self) -> int:
        return len(self.inedges)

    @property
    def outdegree(self) -> int:
        return len(self.outedges)

    @property
    def degrees(self) -> tuple[int, int]:
        return self.indegree, self.outdegree

    # -- the collectives --------------------------------------------------------------------------------------
    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        mine = matching.pickled(sendobj)
        return self._objects("neighbor_allgather", [mine] * self.outdegree)

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
        what = "Neighbor_allgather"
        mine = buffer_of(sendbuf, what).view(np.uint8)
        return self._buffers(what, [mine] * self.outdegree, _split(recvbuf, self.indegree, what, receives=True),
                             mine.nbytes)

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        what = "Neighbor_alltoall"
        sends = [block.view(np.uint8) for block in _split(sendbuf, self.outdegree, what)]
        blocks = _split(recvbuf, self.indegree, what, receives=True)
        return self._buffers(what, sends, blocks, sends[0].nbytes if sends else None)

    def _buffers(self, what: str, sends: list[np.ndarray], blocks: list[np.ndarray], part: int | None) -> Request:
        """The parts to send, and the receive buffer's blocks for the parts that come, each of ``part`` bytes."""
        for block in blocks:
            if part is not None and block.nbytes != part:
                raise ValueError(f"{what}: each neighbour's block of the receive buffer holds {block.nbytes} bytes, "
                                 f"each part sent {part}")

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
        problem = self._neighbour_problem()
        if problem:
            raise MPIException(ERR_TOPOLOGY, f"{what}: {problem}, so a neighbour's part would never come")
        context, kind = CONTEXT_BASE - self._context, KINDS.index(what)
        receives = [matching.post(context, [self._instance(source, what)], ANY_TAG)
                    for source in self.inedges if source != PROC_NULL]
        for k, destination in enumerate(self.outedges):
            if destination != PROC_NULL:
                matching.send(sends[k], context, kind << _KIND_SHIFT | self._tag_for(k),
                              self._instance(destination, what))

        def by_place(messages: list[matching.Message]) -> None:
            parts = {}
            for message in messages:
                theirs, source = message.tag >> _KIND_SHIFT, self._rank_of(message.source)
                if theirs != kind:
                    raise CollectiveMismatchError(f"{what}: rank {source} called {KINDS[theirs]} where rank "
                                                  f"{self.Get_rank()} called {what}")
                parts[self._place_for(source, message.tag & (1 << _KIND_SHIFT) - 1)] = message
            finish(parts)
        return CollectiveRequest(receives, by_place, what)


def _split(spec: Any, degree: int, what: str, receives: bool = False) -> list[np.ndarray]:
    """A buffer's equal blocks, one for each of ``degree`` neighbours (none for none)."""
    if not degree:
        return []
    return equal_blocks(buffer_of(spec, what, receives=receives, blocks=degree), degree, what)
