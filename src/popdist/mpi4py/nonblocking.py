"""The nonblocking collectives, ``Ibarrier``, ``Ibcast``, ``Iallreduce``, ``Iallgather``, ``Igather``,
``Ireduce``, ``Iscatter``, ``Ialltoall``, ``Iscan`` and ``Iexscan`` (the vector ones: ``nonblocking_vectors``; the
reduce-scatters: ``reduce_scatter``):
each sends its part at once, as messages in a context of the
communicator's own, to the ranks that need it, and posts a receive for each part it needs; its request
completes when they have all come (``Wait``, ``Test``, ``Request.Waitall``...), and every MPI call that waits
takes their messages meanwhile, as MPI's progress engine does. So no rank waits for another until it waits
on the request, and the pattern made of them (``Issend``s, then an ``Ibarrier`` tested while receiving)
works. Each part goes straight to the ranks that need it (a broadcast's root sends to every rank), which
suits the small calls these are used for.

A call's messages carry its place among the communicator's nonblocking calls, its kind and its root, so a
rank that made a call of another kind is named with both (``CollectiveMismatchError``); calls of one kind
with different roots may send nothing to the rank that would see it, so they go unnamed, as with Open MPI.
Reductions run in rank order once every part is there: the same bits on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.reductions import Op, reduction
from popdist.mpi4py.requests import Request
from popdist.mpi4py.specs import (
    ANY_TAG,
    README_SECTION,
    Datatype,
    NotProvidedError,
    buffer_of,
    fill,
    in_place,
    same_datatype,
    spec_datatype,
)
from simipu.fabric.errors import CollectiveMismatchError

#: The calls; a call's messages' tag holds its place among the communicator's nonblocking calls (from bit
#: ``_PLACE_SHIFT``), its root plus one (from bit ``_ROOT_SHIFT``; 0: none) and its index here.
KINDS = ("Ibarrier", "Ibcast", "Iallreduce", "Iallgather", "Igather", "Ireduce", "Iscatter", "Ialltoall", "Iscan",
         "Iexscan", "Iallgatherv", "Igatherv", "Iscatterv", "Ialltoallv", "Ireduce_scatter_block", "Ireduce_scatter")
_ROOT_SHIFT, _PLACE_SHIFT = 8, 32
#: Places wrap round below this, so that a tag never reaches ``matching.SYNCHRONOUS``'s bit.
_PLACES = 1 << 29
#: The contexts of their messages, one for each communicator, apart from its own (from 0 up), its blocking
#: collectives' (from -2 down) and the replies to synchronous sends (``matching.REPLY_CONTEXT``).
CONTEXT_BASE = -(1 << 61)


def call_named(tag: int) -> str:
    """The call whose messages have ``tag``, as a user would write it, with its place."""
    place, root = tag >> _PLACE_SHIFT, (tag >> _ROOT_SHIFT & (1 << (_PLACE_SHIFT - _ROOT_SHIFT)) - 1) - 1
    what = KINDS[tag & (1 << _ROOT_SHIFT) - 1]
    return f"{what}{f'(root={root})' if root >= 0 else ''} as nonblocking collective #{place}"


class CollectiveRequest(Request):
    """A nonblocking collective's request: complete when every part it needs has come; ``finish`` then takes
    them (in rank order) and fills the receive buffer."""

    def __init__(self, receives: list[matching.Receive], finish: Callable[[list[matching.Message]], None],
                 what: str) -> None:
        super().__init__(None, what=what)
        self._parts = receives
        self._finish_all = finish
        self._filled = False

    def _fill(self) -> None:
        """``finish`` with every part, once (``Get_status`` fills the buffers as soon as it says complete)."""
        if not self._filled:
            self._finish_all([receive.message for receive in self._parts])  # type: ignore[misc]
            self._filled = True

    def _pending(self) -> list[matching.Receive]:
        return [receive for receive in self._parts if receive.message is None]

    def _done(self) -> bool:
        return not self._pending()

    def _completed(self, block: bool, status: Any) -> tuple[bool, Any]:
        if self._active:
            pending = self._pending()
            while pending:  # (a test takes every part that has come, not one: done once all have, as MPI's)
                moved = matching.progress(pending, block, self._what)
                pending = self._pending()
                if pending and not block and not moved:
                    return False, None
            self._active = False  # (null from now on, even if ``finish`` raises)
            self._fill()
        return super()._completed(block, status)

    def Get_status(self, status: Any = None) -> bool:
        """Whether every part has come (taking what has), without completing the request."""
        if self._active:
            pending = self._pending()
            while pending and matching.progress(pending, False, self._what):
                pending = self._pending()
            if pending:
                return False
            self._fill()
        return super().Get_status(status)

    get_status = Get_status

    def Free(self) -> None:
        if self._active and self._pending():
            raise NotProvidedError(f"Request.Free of {self._what} that has not completed is not provided by "
                                   f"poprun-py's mpi4py (its parts would be taken and dropped): Wait for it first "
                                   f"({README_SECTION})")
        self._active = False


class NonblockingCollectives:
    """``Comm``'s nonblocking collectives (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _context: int
        _nonblocking_calls: int

        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _root_checked(self, root: int, what: str) -> int: ...

    def Ibarrier(self) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        nothing = np.empty(0, np.uint8)
        return self._started("Ibarrier", -1, [None if k == me else nothing for k in range(size)],
                             [k != me for k in range(size)], lambda parts: None)

    def Ibcast(self, buf: Any, root: int = 0) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        root = self._root_checked(root, "Ibcast")
        array = buffer_of(buf, "Ibcast", receives=me != root)
        mine = array.view(np.uint8)
        sends = [mine if me == root and k != me else None for k in range(size)]

        def finish(parts: list[matching.Message]) -> None:
            if me != root:
                matching.deliver(mine, parts[0], "Ibcast", root)
        return self._started("Ibcast", root, sends, [me != root and k == root for k in range(size)], finish)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        recv = buffer_of(recvbuf, "Iallreduce", receives=True)
        send = recv.copy() if in_place(sendbuf) else buffer_of(sendbuf, "Iallreduce")
        same_datatype(send, recv, "Iallreduce")
        operation = reduction(op, "Iallreduce")
        operation.check_buffer(send.dtype, "Iallreduce")
        datatype = spec_datatype(recvbuf)
        return self._started("Iallreduce", -1, [None if k == me else send.view(np.uint8) for k in range(size)],
                             [k != me for k in range(size)],
                             lambda parts: fill(recv, reduced_parts(parts, send, me, operation, "Iallreduce", datatype),
                                                "Iallreduce"))

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None, root: int = 0) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        root = self._root_checked(root, "Ireduce")
        recv = buffer_of(recvbuf, "Ireduce", receives=True) if me == root else None
        if in_place(sendbuf):
            if recv is None:
                raise ValueError("Ireduce: only the root may pass MPI.IN_PLACE")
            send = recv.copy()
        else:
            send = buffer_of(sendbuf, "Ireduce")
        if recv is not None:
            same_datatype(send, recv, "Ireduce")
        operation = reduction(op, "Ireduce")
        operation.check_buffer(send.dtype, "Ireduce")
        datatype = spec_datatype(sendbuf) or spec_datatype(recvbuf)

        def finish(parts: list[matching.Message]) -> None:
            if recv is not None:
                fill(recv, reduced_parts(parts, send, me, operation, "Ireduce", datatype), "Ireduce")
        return self._started("Ireduce", root, [send.view(np.uint8) if me != root and k == root else None
                                               for k in range(size)],
                             [me == root and k != me for k in range(size)], finish)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:
        size = self.Get_size()
        recv = buffer_of(recvbuf, "Iallgather", receives=True, blocks=size)
        return self._gathered("Iallgather", None, equal_blocks(recv, size, "Iallgather"), sendbuf)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        size, root = self.Get_size(), self._root_checked(root, "Igather")
        blocks = equal_blocks(buffer_of(recvbuf, "Igather", receives=True, blocks=size), size, "Igather") \
            if self.Get_rank() == root else []
        return self._gathered("Igather", root, blocks, sendbuf)

    def _gathered(self, what: str, root: int | None, blocks: list[np.ndarray], sendbuf: Any) -> Request:
        """Every rank's part into its block of ``blocks``, on every rank (``root`` None) or on ``root`` alone
        (the others' ``blocks`` empty): the gathers, equal or vector (``nonblocking_vectors``)."""
        size, me = self.Get_size(), self.Get_rank()
        if in_place(sendbuf):
            if not blocks:
                raise ValueError(f"{what}: only the root may pass MPI.IN_PLACE")
            send = blocks[me].copy()
        else:
            send = buffer_of(sendbuf, what)
        gets = [k != me and (root is None or me == root) for k in range(size)]
        sends = [send.view(np.uint8) if k != me and (root is None or k == root) else None for k in range(size)]
        return self._started(what, -1 if root is None else root, sends, gets,
                             lambda parts: place_parts(blocks, parts, send, me, what) if blocks else None)

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        size, root = self.Get_size(), self._root_checked(root, "Iscatter")
        blocks = equal_blocks(buffer_of(sendbuf, "Iscatter", blocks=size), size, "Iscatter") \
            if self.Get_rank() == root else []
        return self._scattered("Iscatter", root, blocks, recvbuf)

    def _scattered(self, what: str, root: int, blocks: list[np.ndarray], recvbuf: Any) -> Request:
        """Block k of the root's ``blocks`` (the others' empty) into rank k's ``recvbuf`` (the root's
        ``MPI.IN_PLACE``: its own block stays where it is): the scatters, equal or vector."""
        size, me = self.Get_size(), self.Get_rank()
        if in_place(recvbuf) and me != root:
            raise ValueError(f"{what}: only the root may pass MPI.IN_PLACE")
        recv = None if in_place(recvbuf) else buffer_of(recvbuf, what, receives=True)
        if blocks and recv is not None:
            matching.copy_into(recv.view(np.uint8), blocks[me].view(np.uint8), what, me)

        def finish(parts: list[matching.Message]) -> None:
            if me != root and recv is not None:
                matching.deliver(recv.view(np.uint8), parts[0], what, root)
        return self._started(what, root, [blocks[k].view(np.uint8) if blocks and k != me else None
                                          for k in range(size)],
                             [me != root and k == root for k in range(size)], finish)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        recv = equal_blocks(buffer_of(recvbuf, "Ialltoall", receives=True, blocks=size), size, "Ialltoall")
        send = ([block.copy() for block in recv] if in_place(sendbuf)  # (MPI.IN_PLACE: the blocks to send are there)
                else equal_blocks(buffer_of(sendbuf, "Ialltoall", blocks=size), size, "Ialltoall"))
        _own(recv[me], send[me], "Ialltoall")

        def finish(parts: list[matching.Message]) -> None:
            others = [k for k in range(size) if k != me]
            for k, part in zip(others, parts):
                matching.deliver(recv[k].view(np.uint8), part, "Ialltoall", k)
        return self._started("Ialltoall", -1,
                             [None if k == me else block.view(np.uint8) for k, block in enumerate(send)],
                             [k != me for k in range(size)], finish)

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> Request:
        """``Scan``'s prefix reduction: the parts of the ranks before this one and its own, in rank order."""
        return self._started_prefix(sendbuf, recvbuf, op, "Iscan")

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> Request:
        """``Exscan``'s: the parts of the ranks before this one (rank 0's buffer is left as it was)."""
        return self._started_prefix(sendbuf, recvbuf, op, "Iexscan")

    def _started_prefix(self, sendbuf: Any, recvbuf: Any, op: Op | None, what: str) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        recv = buffer_of(recvbuf, what, receives=True)
        send = recv.copy() if in_place(sendbuf) else buffer_of(sendbuf, what)
        same_datatype(send, recv, what)
        operation = reduction(op, what)
        operation.check_buffer(send.dtype, what)
        datatype = spec_datatype(recvbuf)

        def finish(parts: list[matching.Message]) -> None:
            contributions = [_part_as(part, send, k, what) for k, part in enumerate(parts)]
            if what == "Iscan":
                contributions.append(send)
            if contributions:
                fill(recv, operation.reduce_arrays(contributions, what, datatype), what)
        return self._started(what, -1, [send.view(np.uint8) if k > me else None for k in range(size)],
                             [k < me for k in range(size)], finish)

    def _started(self, what: str, root: int, sends: Sequence[np.ndarray | None], needs: Sequence[bool],
                 finish: Callable[[list[matching.Message]], None]) -> Request:
        """Post a receive from each rank that ``needs`` says, send each rank its part (None: nothing), and the
        request that completes when the receives have; ``finish`` takes their messages in rank order."""
        self._nonblocking_calls += 1
        place = self._nonblocking_calls % _PLACES
        tag = place << _PLACE_SHIFT | (root + 1) << _ROOT_SHIFT | KINDS.index(what)
        context, me, size = CONTEXT_BASE - self._context, self.Get_rank(), self.Get_size()
        ranks = [k for k in range(size) if needs[k]]
        receives = [matching.post(context, [self._instance(k, what)], ANY_TAG) for k in ranks]
        for k in [*range(me + 1, size), *range(me + 1)]:  # (from the one after us: no rank is everyone's first)
            part = sends[k]
            if part is not None:
                matching.send(part, context, tag, self._instance(k, what))

        def checked(messages: list[matching.Message]) -> None:
            for k, message in zip(ranks, messages):
                if message.tag != tag:
                    raise CollectiveMismatchError(f"{what}: rank {k} called {call_named(message.tag)} where rank "
                                                  f"{me} called {call_named(tag)}")
            finish(messages)
        return CollectiveRequest(receives, checked, what)


def equal_blocks(flat: np.ndarray, size: int, what: str) -> list[np.ndarray]:
    """A buffer's equal blocks, one for each rank."""
    if flat.size % size:
        raise ValueError(f"{what}: the buffer's {flat.size} items do not split into {size} ranks' blocks")
    n = flat.size // size
    return [flat[k * n:(k + 1) * n] for k in range(size)]


def _own(block: np.ndarray, mine: np.ndarray, what: str) -> None:
    """This rank's part into its own block, byte for byte, as the others' come."""
    if block.nbytes != mine.nbytes:
        raise ValueError(f"{what}: this rank's part has {mine.nbytes} bytes, its block in the receive buffer "
                         f"{block.nbytes}")
    block.view(np.uint8)[:] = mine.view(np.uint8)


def place_parts(blocks: list[np.ndarray], parts: list[matching.Message], mine: np.ndarray, me: int, what: str) -> None:
    """Each rank's part into its block (``parts``: the others', in rank order; ``mine``: this rank's)."""
    others = iter(parts)
    for k, block in enumerate(blocks):
        if k == me:
            _own(block, mine, what)
        else:
            matching.deliver(block.view(np.uint8), next(others), what, k)


def reduced_parts(parts: list[matching.Message], mine: np.ndarray, me: int, op: Op, what: str,
                  datatype: Datatype | None = None) -> np.ndarray:
    """Every rank's part reduced in rank order (``parts``: the others', in rank order; ``mine``: this rank's;
    ``datatype``: what a user's function is told)."""
    others = iter(parts)
    contributions = [mine if k == me else _part_as(next(others), mine, k, what) for k in range(len(parts) + 1)]
    return op.reduce_arrays(contributions, what, datatype)


def _part_as(part: matching.Message, mine: np.ndarray, rank: int, what: str) -> np.ndarray:
    """Rank ``rank``'s part as an array like this rank's own (its bytes, of the same size)."""
    if part.data.size != mine.nbytes:
        raise ValueError(f"{what}: rank {rank} gave {part.data.size} bytes, this rank {mine.nbytes}")
    return np.frombuffer(part.data, mine.dtype)
