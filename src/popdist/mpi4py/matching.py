"""Messages matched to receives as MPI matches them, for ``Comm``'s point to point and its requests.

A message travels as one fabric message (``simipu.fabric.engine.Fabric.send``): its envelope (tag, bytes,
communicator's context) and its bytes; above ``INLINE_BYTES``, its bytes follow in a second one. A message
that has come before a receive wants it waits here, in arrival order. Receives (a blocking ``recv`` while it
waits, an ``irecv`` until it completes) are matched in the order they were posted, each to the earliest
message that has come that it accepts (its source or any of its communicator's, its tag or any, its
communicator): MPI's rule that messages from one sender do not overtake each other, and that a receive posted
first is matched first.

A synchronous send's message (``send_synchronous``) carries a number of its sender's, above the tag's
``TAG_BITS``: when a receive matches it, the receiver sends that number back in ``REPLY_CONTEXT``, where the
sender's request waits for it, so that request completes only once the message has been matched (MPI's
synchronous mode).
"""

from __future__ import annotations

import bisect
import os
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from popdist.backend import current_fabric, fabric_place
from popdist.mpi4py.specs import ANY_TAG, ERR_TRUNCATE, MPIException

#: The envelope at the front of a message's first fabric message: tag, byte count, communicator's context.
_ENVELOPE = struct.Struct("=3q")
ENVELOPE_BYTES = _ENVELOPE.size
#: A message of up to this many bytes travels in its envelope's fabric message (one copy of it, one frame);
#: a larger one in a fabric message of its own after the envelope (no copy).
INLINE_BYTES = 64 * 1024
#: The largest message a blocking object receive takes into the scratch buffer, which keeps the size of the
#: largest it took: its pages are faulted in once, not for every message (above it, a new array each time).
SCRATCH_BYTES = 64 * 1024 * 1024
#: A user's tag fits in this many bits (MPI's largest tag, ``TAG_UB``, is 2**31 - 1 here, as Open MPI's).
TAG_BITS = 32
TAG_UB = (1 << (TAG_BITS - 1)) - 1
_TAG_MASK = (1 << TAG_BITS) - 1
#: In an envelope's tag: a synchronous send's message, whose sender's number is the bits above ``TAG_BITS``.
SYNCHRONOUS = 1 << 62
_NUMBERS = 1 << 29
#: The context of the replies to synchronous sends (communicators' contexts are from 0, collectives' to -2).
REPLY_CONTEXT = -(1 << 62)
_NOTHING = np.empty(0, np.uint8)


@dataclass(frozen=True)
class Message:
    """A message that has come: from which instance, in which communicator, with which tag, its bytes;
    ``placed`` if they were received straight into the room of the receive that takes it (``data`` is the
    start of that room: nothing to copy)."""

    context: int
    source: int
    tag: int
    data: np.ndarray
    placed: bool = False
    #: A synchronous send's: the sender's number, to send back when a receive matches it (-1: none).
    reply: int = -1

    @classmethod
    def of(cls, context: int, source: int, tag: int, data: np.ndarray, placed: bool = False) -> Message:
        """A message as its envelope's tag says it, a synchronous send's number taken apart from the tag."""
        if tag & SYNCHRONOUS:
            return cls(context, source, tag & _TAG_MASK, data, placed, (tag ^ SYNCHRONOUS) >> TAG_BITS)
        return cls(context, source, tag, data, placed)


@dataclass(eq=False)
class Receive:
    """A receive posted on a communicator (``context``) from any of ``sources`` (instances) with ``tag`` (or
    ``ANY_TAG``); ``message`` once it is matched."""

    context: int
    sources: frozenset[int]
    tag: int
    message: Message | None = None
    #: A buffer receive's memory (bytes): a message above ``INLINE_BYTES`` that this receive will take is
    #: received straight into it (one copy fewer, and no new array to fault in).
    room: np.ndarray | None = None
    #: A blocking receive of an object, unpickled as soon as it is matched: such a message (up to
    #: ``SCRATCH_BYTES``) is received into this process's scratch buffer (``_room_for``).
    scratch: bool = False

    def accepts(self, message: Message) -> bool:
        return self.accepts_envelope(message.context, message.source, message.tag)

    def accepts_envelope(self, context: int, source: int, tag: int) -> bool:
        return context == self.context and source in self.sources and self.tag in (ANY_TAG, tag)


@dataclass
class _Matching:
    """This process's messages not yet received (in arrival order) and receives not yet matched (in post order)."""

    arrived: list[Message] = field(default_factory=list)
    posted: list[Receive] = field(default_factory=list)
    #: The source a wait on several last took a message from: the next such wait looks at the ones after it
    #: first, so that a rank sending without pause cannot keep a higher rank's message waiting.
    turn: int = -1
    #: The blocking object receives' buffer (``Receive.scratch``).
    scratch: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))
    #: The number of this process's last synchronous send (``send_synchronous``).
    synchronous: int = 0
    #: For each source, how many posted receives take its messages: the ranks a wait watches (``_watched``),
    #: kept as receives come and go, so that a wait among many posted receives does not count them again.
    watching: dict[int, int] = field(default_factory=dict)


_state = _Matching()


def _forget_all() -> None:
    """A forked instance (``launch()``'s) is not its parent: it starts with nothing arrived or posted."""
    _state.arrived.clear()
    _state.posted.clear()
    _state.watching.clear()
    _state.turn = -1


os.register_at_fork(after_in_child=_forget_all)


def send(data: np.ndarray, context: int, tag: int, peer: int) -> None:
    """``data`` (bytes) to instance ``peer`` (ourselves: straight to our own arrivals, copied)."""
    if peer == fabric_place()[0]:
        _arrive(Message.of(context, peer, tag, data.copy()))
        return
    fabric = current_fabric()
    envelope = _ENVELOPE.pack(tag, data.size, context)
    if data.size <= INLINE_BYTES:  # (one frame: half the work a message for both ends)
        fabric.send(np.frombuffer(envelope + data.data, np.uint8), peer)
        return
    fabric.send(np.frombuffer(envelope, np.uint8), peer)
    fabric.send(data, peer)


def send_synchronous(data: np.ndarray, context: int, tag: int, peer: int) -> Receive:
    """``send``'s message to ``peer``, marked for a reply once a receive there matches it (module docstring);
    the receive that takes the reply, posted first (an ``issend``'s request)."""
    _state.synchronous = _state.synchronous % _NUMBERS + 1
    reply = post(REPLY_CONTEXT, [peer], _state.synchronous)
    send(data, context, tag | SYNCHRONOUS | _state.synchronous << TAG_BITS, peer)
    return reply


def post(context: int, sources: Iterable[int], tag: int, room: np.ndarray | None = None,
         scratch: bool = False) -> Receive:
    """A receive (into ``room``, a buffer receive's bytes; or, with ``scratch``, a blocking receive whose
    message is used up before the next receive: see ``Receive.scratch``), matched at once if a message it
    accepts has come."""
    receive = Receive(context, frozenset(sources), tag, room=room, scratch=scratch)
    _state.posted.append(receive)
    _count(receive, 1)
    _match()
    return receive


def withdraw(receive: Receive) -> None:
    """Forget a receive that will not be waited for (its blocking wait was interrupted): it takes nothing more."""
    if receive in _state.posted:
        _state.posted.remove(receive)
        _count(receive, -1)


def _count(receive: Receive, change: int) -> None:
    """A receive posted (1) or gone (-1), in ``_Matching.watching``."""
    watching = _state.watching
    for source in receive.sources:
        left = watching.get(source, 0) + change
        if left:
            watching[source] = left
        else:
            del watching[source]


def progress(receives: Iterable[Receive], block: bool, what: str, collective: bool = False) -> bool:
    """Whether any of ``receives`` has its message, after taking the messages that have come from their sources
    (with ``block``, waiting until one of them has). A wait for a message that no instance can send (only we
    could, and we wait) raises ValueError; one that every source's collective blocks, the fabric's
    ``CollectiveMismatchError`` (naming ``what`` if the wait is a part of that ``collective``)."""
    receives = list(receives)
    return _taking_until(lambda: any(r.message is not None for r in receives),
                         set().union(*(r.sources for r in receives)), block, what, collective)


def probe(context: int, sources: Iterable[int], tag: int, block: bool, what: str) -> Message | None:
    """The first message that has come that a receive (``context``, ``sources``, ``tag``) would take, left for
    the receive; None if there is none (with ``block``, waits for one)."""
    wanted = Receive(context, frozenset(sources), tag)

    def first() -> Message | None:
        return next((m for m in _state.arrived if wanted.accepts(m)), None)
    return first() if _taking_until(lambda: first() is not None, wanted.sources, block, what) else None


def _taking_until(done: Callable[[], bool], sources: set[int] | frozenset[int], block: bool, what: str,
                  collective: bool = False) -> bool:
    """Take the messages that come from ``sources`` until ``done()`` (True), or none has come (False; with
    ``block``, wait). Meanwhile the messages of the other ranks that posted receives are waiting for are
    taken and matched too (MPI's progress: a synchronous send to a receive posted here completes while this
    rank waits for something else). ``collective``: the wait is a part of collective ``what``."""
    me = fabric_place()[0]
    peers = sorted(sources - {me})
    while not done():
        if not peers:
            if block:
                raise ValueError(f"{what}: no message this rank sent itself matches, and no other rank can send one")
            return False
        after = bisect.bisect_right(peers, _state.turn)  # (in turn: see ``_Matching.turn``)
        source = current_fabric().message_waiting(peers[after:] + peers[:after], block, _watched(peers, me),
                                                  what if collective else None)
        if source is None:
            return False
        _take(source)
        if len(peers) > 1:
            _state.turn = source
    return True


def _watched(peers: list[int], me: int) -> list[int]:
    """The ranks that posted receives wait for besides ``peers`` (and us), whose messages a wait takes too."""
    watching = _state.watching
    if not watching:
        return []
    return sorted(source for source in watching if source != me and source not in peers)


def arrived_from(source: int) -> list[Message]:
    """The messages from instance ``source`` that have come and that no receive has taken yet, in order."""
    return [message for message in _state.arrived if message.source == source]


def envelope_of(first: bytes | bytearray) -> tuple[int, int, int] | None:
    """A message's envelope (tag, byte count, context) from its first fabric message (``send``); None if ``first``
    is too short to be one."""
    if len(first) < ENVELOPE_BYTES:
        return None
    tag, nbytes, context = _ENVELOPE.unpack_from(first)
    return tag, nbytes, context


def bytes_follow(first: bytes | bytearray, nbytes: int) -> bool:
    """Whether the bytes of the message whose first fabric message is ``first`` (its envelope saying ``nbytes``)
    come in a fabric message of their own (``send``: above ``INLINE_BYTES``)."""
    return len(first) == ENVELOPE_BYTES and nbytes > 0


def _take(source: int) -> None:
    """Instance ``source``'s next message (its first fabric message has come), then the matching."""
    fabric = current_fabric()
    first = fabric.take_waiting(source)
    tag, nbytes, context = _ENVELOPE.unpack_from(first)
    if not bytes_follow(first, nbytes):
        _arrive(Message.of(context, source, tag, np.frombuffer(first, np.uint8, offset=ENVELOPE_BYTES)))
        return
    room = _room_for(context, source, tag & _TAG_MASK, nbytes)
    if room is None:
        _arrive(Message.of(context, source, tag, fabric.recv(np.empty(nbytes, np.uint8), source)))
    else:
        _arrive(Message.of(context, source, tag, fabric.recv(room, source, out=room), placed=True))


def pickled(obj: Any) -> np.ndarray:
    """An object as the bytes of a message (``send``'s, ``alltoall``'s)."""
    return np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)


def unpickled(message: Message) -> Any:
    """The object a message carries. (No copy of the bytes first: ``loads`` reads the array's buffer, and
    copies what it keeps, so the scratch buffer may be used again at once.)"""
    return pickle.loads(message.data.data)  # noqa: S301 - from this job's own instances only (popdist.ragged)


def all_to_all(instances: Sequence[int], me: int, context: int, blocks: Sequence[np.ndarray],
               rooms: Sequence[np.ndarray | None], tag: int, what: str) -> list[Message]:
    """Block k (bytes) to ``instances[k]`` and its block for us (into ``rooms[k]`` when it fits), as messages in
    ``context`` with ``tag``: receives posted first (of any tag, so that a peer in another exchange is seen:
    the caller compares the tags), sends in turn from the one after us (``me``) on, so that no instance is
    everyone's first, then every receive taken. A peer that called a collective meanwhile is the fabric's
    ``CollectiveMismatchError`` (naming ``what``), as in a collective."""
    receives = [post(context, [instance], ANY_TAG, room) for instance, room in zip(instances, rooms)]
    for k in [*range(me + 1, len(instances)), *range(me + 1)]:
        send(blocks[k], context, tag, instances[k])
    try:
        while any(receive.message is None for receive in receives):
            progress([receive for receive in receives if receive.message is None], True, what, collective=True)
    except BaseException:
        for receive in receives:
            withdraw(receive)
        raise
    return [receive.message for receive in receives]  # type: ignore[misc]  # (each has its message now)


def deliver(room: np.ndarray, message: Message, what: str, sender: int) -> None:
    """A message's bytes into the start of a receive buffer's (bytes), which must have room (MPI_ERR_TRUNCATE),
    unless they were received there already (``Message.placed``)."""
    if not message.placed:
        copy_into(room, message.data, what, sender)


def copy_into(room: np.ndarray, data: np.ndarray, what: str, sender: int) -> None:
    """Bytes that rank ``sender`` sent into the start of a receive buffer's, which must have room for them."""
    if data.size > room.size:
        raise MPIException(ERR_TRUNCATE, f"{what}: message truncated: rank {sender} sent {data.size} bytes, the "
                           f"receive buffer holds {room.size}")
    room[:data.size] = data


def _room_for(context: int, source: int, tag: int, nbytes: int) -> np.ndarray | None:
    """The start of the room of the receive that a message (``context``, ``source``, ``tag``) of ``nbytes``
    will be matched to, if that is a buffer receive with room for it: the first posted receive that accepts it
    (no posted receive accepts a message that came before: ``_match`` matched it then)."""
    for receive in _state.posted:
        if receive.accepts_envelope(context, source, tag):
            if receive.scratch and nbytes <= SCRATCH_BYTES:
                if _state.scratch.size < nbytes:
                    _state.scratch = np.empty(nbytes, np.uint8)
                return _state.scratch[:nbytes]
            room = receive.room
            return room[:nbytes] if room is not None and room.size >= nbytes else None
    return None


def _arrive(message: Message) -> None:
    _state.arrived.append(message)
    _match()


def _match() -> None:
    """Each unmatched receive, in post order, takes the earliest message it accepts."""
    arrived, posted = _state.arrived, _state.posted
    if not arrived or not posted:
        return
    replies = []
    for receive in list(posted):
        found = next((k for k, m in enumerate(arrived) if receive.accepts(m)), None)
        if found is not None:
            receive.message = message = arrived.pop(found)
            posted.remove(receive)
            _count(receive, -1)
            if message.reply >= 0:
                replies.append(message)
            if not arrived:
                break
    for message in replies:  # (after the loop: a reply to ourselves is matched here again)
        send(_NOTHING, REPLY_CONTEXT, message.reply, message.source)
