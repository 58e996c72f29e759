"""``alltoall``, ``Alltoall`` and ``Alltoallv``: each rank's block for rank k travels as a message
(``matching.all_to_all``) in a context of the communicator's collectives: messages' contexts are from 0, so the
user's never match these.

Each exchange's messages carry a tag that names the call (and its root), so a rank that made another
exchange (``Scatterv`` against ``Alltoall``, or another root) is named with both calls, on every rank,
rather than taken for a block of this one. A rank in a collective of the fabric meanwhile is named too: its
frame ends our wait for its block (``Fabric.message_waiting``), and where that collective sends us nothing (a
small broadcast's reader among three ranks or more, whose root we are), our block tells it which call we made
(``exchange_of``, registered with the fabric) where it waits for our frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.neighbours import CONTEXT_BASE as NEIGHBOUR_CONTEXTS
from popdist.mpi4py.specs import buffer_of, in_place
from popdist.mpi4py.vectors import vector_of
from simipu.fabric.errors import CollectiveMismatchError
from simipu.fabric.frames.header import name_collective_messages

#: The calls that exchange blocks as messages; a call's tag is its index here, plus as many for each root.
EXCHANGES = ("alltoall", "Alltoall", "Scatterv", "Alltoallv")


def exchange_tag(what: str, root: int = -1) -> int:
    """The tag of a call's messages: which call, and its root (none: -1)."""
    return EXCHANGES.index(what) + len(EXCHANGES) * (root + 1)


def exchange_named(tag: int) -> str:
    """The call that sent messages with ``tag`` (``exchange_tag``'s inverse), as a user would write it."""
    what, root = EXCHANGES[tag % len(EXCHANGES)], tag // len(EXCHANGES) - 1
    return what if root < 0 else f"{what}(root={root})"


def exchange_of(peer: int, payloads: Sequence[bytes | bytearray]) -> str | None:
    """The exchange that instance ``peer`` is in, as ``exchange_named`` names it, if one of its messages that no
    receive has taken is a part of one (those we took from the fabric, and those the fabric holds: ``payloads``,
    in the order they came), else None. An exchange's context is -2 minus its communicator's (from 0 up: far
    above the neighbour collectives' and the others' below them); a message's first fabric message is its
    envelope, whose bytes are with it or in the next one (``matching.send``). Such a message is a block of an
    exchange that this rank has not joined (joining takes the peer's block), so the peer waits in it for ours."""
    for message in matching.arrived_from(peer):
        if NEIGHBOUR_CONTEXTS < message.context <= -2:
            return exchange_named(message.tag)
    bytes_next = False
    for payload in payloads:
        envelope = None if bytes_next else matching.envelope_of(payload)
        bytes_next = False
        if envelope is not None:
            tag, nbytes, context = envelope
            if NEIGHBOUR_CONTEXTS < context <= -2:
                return exchange_named(tag)
            bytes_next = matching.bytes_follow(payload, nbytes)
    return None


#: A collective of the fabric that waits for a peer's frame and meets its exchange's block is told which call
#: that is: ``Bcast`` against ``Alltoall`` is a mismatch, not a message to keep for a later ``recv``.
name_collective_messages(exchange_of)


class AllToAll:
    """``Comm``'s all-to-all (see the module docstring), and the exchange the vector collectives use too."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _context: int

        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """Item k of ``sendobj`` to rank k; item k of the result from rank k (collective)."""
        size = self.Get_size()
        if sendobj is None or len(sendobj) != size:
            raise ValueError(f"alltoall: every rank gives a sequence of {size} objects, one for each rank")
        received = self._all_to_all([matching.pickled(obj) for obj in sendobj], [None] * size, "alltoall")
        return [matching.unpickled(message) for message in received]

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block k of ``sendbuf`` (its items split into as many equal blocks as ranks) to rank k; rank k's block
        for us into block k of ``recvbuf`` (collective)."""
        size = self.Get_size()
        recv = buffer_of(recvbuf, "Alltoall", receives=True, blocks=size).view(np.uint8)
        send = recv.copy() if in_place(sendbuf) else buffer_of(sendbuf, "Alltoall", blocks=size).view(np.uint8)
        if send.size % size or recv.size != send.size:
            raise ValueError(f"Alltoall: the send buffer's {send.size} bytes must split into {size} equal blocks, "
                             f"and the receive buffer must hold as many ({recv.size})")
        block = send.size // size
        parts = [slice(k * block, (k + 1) * block) for k in range(size)]
        received = self._all_to_all([send[part] for part in parts], [recv[part] for part in parts], "Alltoall")
        for k, (part, message) in enumerate(zip(parts, received)):
            matching.deliver(recv[part], message, "Alltoall", k)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block k of ``sendbuf`` (its count and displacement k) to rank k; rank k's block for us into place k
        of ``recvbuf`` (collective). Both specs are the vector collectives' (``vectors.vector_of``)."""
        size = self.Get_size()
        recv, receives = vector_of(recvbuf, size, "Alltoallv", receives=True)
        send, sends = (recv.copy(), receives) if in_place(sendbuf) else vector_of(sendbuf, size, "Alltoallv")
        rooms = [recv[place].view(np.uint8) for place in receives]
        received = self._all_to_all([send[place].view(np.uint8) for place in sends], rooms, "Alltoallv")
        for k, (room, message) in enumerate(zip(rooms, received)):
            matching.deliver(room, message, "Alltoallv", k)

    def _all_to_all(self, blocks: Sequence[np.ndarray], rooms: Sequence[np.ndarray | None],
                    what: str, root: int = -1) -> list[matching.Message]:
        """``matching.all_to_all`` among this communicator's ranks, in a context of its collectives, with the
        tag of call ``what`` (and ``root``); a rank whose messages say it made another call is named."""
        instances = [self._instance(k, what) for k in range(self.Get_size())]
        tag, me = exchange_tag(what, root), self.Get_rank()
        received = matching.all_to_all(instances, me, -2 - self._context, blocks, rooms, tag, exchange_named(tag))
        for k, message in enumerate(received):
            if message.tag != tag:
                raise CollectiveMismatchError(f"{what}: rank {k} called {exchange_named(message.tag)} where rank "
                                              f"{me} called {exchange_named(tag)}")
        return received
