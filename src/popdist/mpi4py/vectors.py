"""The vector collectives, ``Allgatherv``, ``Gatherv`` and ``Scatterv``: each rank's block of its own size,
at its own place in the buffer, as ``[buffer, counts]``, ``[buffer, counts, displacements, datatype]``,
``[buffer, (counts, displacements)]``, with or without a datatype, or the buffer alone, as mpi4py takes them
(counts and displacements in items; displacements default to the counts' running sum).

``Allgatherv`` and ``Gatherv`` gather every rank's block (``popdist.ragged.allgather_rows``: its size may
differ from the others'), and each rank (the root) puts each block at its place. ``Scatterv`` sends each
rank its block alone, as a message in a context of the communicator's collectives (``matching.all_to_all``,
empty blocks from the other ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.specs import ERR_ARG, MPIException, buffer_of, in_place, is_int, spec_parts
from popdist.ragged import allgather_rows


def vector_of(spec: Any, size: int, what: str, receives: bool = False) -> tuple[np.ndarray, list[slice]]:
    """A vector buffer spec's memory (one-dimensional, as ``buffer_of``) and each rank's part of it, read as
    mpi4py reads one: no counts, the buffer split as evenly as it goes (the first ranks one item more); an int
    count or displacement, the same count for every rank, or blocks that far apart."""
    buffer, counts, displacements, datatype = spec_parts(spec, what, pairs=(tuple,))
    flat = buffer_of(buffer if datatype is None else [buffer, datatype], what, receives)
    if counts is None:
        counts = [flat.size // size + (flat.size % size > k) for k in range(size)]
    counts = [int(counts)] * size if is_int(counts) else _ints(counts, size, "counts", what)
    if displacements is None:
        displacements = [sum(counts[:k]) for k in range(size)]
    elif is_int(displacements):
        displacements = [int(displacements) * k for k in range(size)]
    displacements = _ints(displacements, size, "displacements", what)
    places = [slice(at, at + count) for at, count in zip(displacements, counts)]
    if any(place.stop > flat.size for place in places if place.stop > place.start):  # (an empty one goes anywhere)
        raise ValueError(f"{what}: the counts and displacements reach past the buffer's {flat.size} items")
    return flat, places


def _ints(values: Any, size: int, name: str, what: str) -> list[int]:
    if not isinstance(values, (list, tuple, np.ndarray)) or len(values) != size \
            or not all(is_int(v) and v >= 0 for v in values):
        raise MPIException(ERR_ARG, f"{what}: {name} must be {size} ints from 0, one for each rank (or one int "
                                    "for all)")
    return [int(v) for v in values]


class VectorCollectives:
    """``Comm``'s vector collectives (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _group(self) -> tuple[int, ...] | None: ...
        def _in_rank_order(self, gathered: Any) -> Any: ...
        def _root_checked(self, root: int, what: str) -> int: ...
        def _all_to_all(self, blocks: Sequence[np.ndarray], rooms: Sequence[np.ndarray | None],
                        what: str, root: int = -1) -> list[matching.Message]: ...

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        recv, places = vector_of(recvbuf, self.Get_size(), "Allgatherv", receives=True)
        send = recv[places[self.Get_rank()]].copy() if in_place(sendbuf) else buffer_of(sendbuf, "Allgatherv")
        _put(recv, places, self._in_rank_order(allgather_rows(send, self._group())), "Allgatherv")

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        is_root = self.Get_rank() == self._root_checked(root, "Gatherv")
        recv, places = vector_of(recvbuf, self.Get_size(), "Gatherv", receives=True) if is_root else (None, [])
        if in_place(sendbuf):
            if recv is None:
                raise ValueError("Gatherv: only the root may pass MPI.IN_PLACE")
            send = recv[places[self.Get_rank()]].copy()
        else:
            send = buffer_of(sendbuf, "Gatherv")
        blocks = self._in_rank_order(allgather_rows(send, self._group()))
        if recv is not None:
            _put(recv, places, blocks, "Gatherv")

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        size, me = self.Get_size(), self.Get_rank()
        is_root = me == self._root_checked(root, "Scatterv")
        if in_place(recvbuf) and not is_root:
            raise ValueError("Scatterv: only the root may pass MPI.IN_PLACE")
        recv = buffer_of(recvbuf, "Scatterv", receives=True) if not in_place(recvbuf) else None
        empty = np.empty(0, np.uint8)
        if is_root:
            send, places = vector_of(sendbuf, size, "Scatterv")
            blocks: Sequence[np.ndarray] = [send[place].view(np.uint8) for place in places]
        else:
            blocks = [empty] * size
        rooms = [None if recv is None or k != root else recv.view(np.uint8) for k in range(size)]
        received = self._all_to_all(blocks, rooms, "Scatterv", root)
        if recv is not None:
            matching.deliver(recv.view(np.uint8), received[root], "Scatterv", root)


def _put(recv: np.ndarray, places: list[slice], blocks: Sequence[np.ndarray], what: str) -> None:
    """Each rank's block at its place; a block of another size than its count is the caller's error, as MPI's."""
    for rank, (place, block) in enumerate(zip(places, blocks)):
        if block.size != place.stop - place.start:
            raise ValueError(f"{what}: rank {rank} sent {block.size} items where its count says "
                             f"{place.stop - place.start}")
        np.copyto(recv[place], block.reshape(-1), casting="unsafe")
