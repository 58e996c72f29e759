"""The data links' wire format: frame headers, collective signatures, and the two notice frames.

A frame is a header then ``nbytes`` of payload, whichever way it travels (a
socket stream, or a shared-memory mailbox; see ``mailbox``). The header
carries the collective's *signature* (kind, op, phase, dtype, shape, root,
sequence number, group) so that a receiver can tell, before touching the
payload, whether its peer is running the same collective; a difference
becomes a ``CollectiveMismatchError`` naming both sides instead of garbage or
a hang.

Two kinds of frame are not collectives but notices, sent once when a fabric
breaks so that peers waiting on it stop too: ``ABORT`` (a peer was lost:
which, and why) and ``MISMATCH`` (a collective mismatch was seen elsewhere:
the message). Both carry a small JSON body, never pickle.

Between frames a socket stream may hold ``WAKE`` bytes: a sender's nudge to a
receiver sleeping in ``poll`` while it waits on a mailbox. Receivers skip them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ... import framing
from ..errors import CollectiveMismatchError, FabricError, PeerLostError

MAGIC = b"PF"
# kinds
ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER, BARRIER, MESSAGE, MISMATCH, ABORT = 1, 2, 3, 4, 5, 6, 14, 15
KIND_NAMES = {ALLREDUCE: "allreduce", BROADCAST: "broadcast", ALLGATHER: "allgather",
              REDUCE_SCATTER: "reduce_scatter", BARRIER: "barrier", MESSAGE: "send/recv",
              MISMATCH: "mismatch notice", ABORT: "abort"}
OP_CODES = {"sum": 1, "mean": 2, "max": 3, "min": 4, "prod": 5}
OP_NAMES = {code: name for name, code in OP_CODES.items()}
#: A byte that is never the first of a frame: a wake-up nudge between frames on a socket stream.
WAKE = 0

#: magic, kind, op, phase, ndim, dtype.str, root, seq, group key; then ndim x int64 shape; then uint64 nbytes
FIXED = struct.Struct("<2sBBBB8siQQ")
NBYTES = struct.Struct("<Q")
#: Where the sequence number sits in a header: a header made once per signature can take each call's there.
SEQ_AT = struct.calcsize("<2sBBBB8si")
_SEQ = struct.Struct("<Q")
#: ``put_seq(header, SEQ_AT, seq)``: a call's sequence number into a header made once (``HeaderTemplate.bytes``).
put_seq = _SEQ.pack_into
_SHAPES = [struct.Struct(f"<{ndim}q") for ndim in range(33)]


#: What a call of one (kind, dtype, shape) is besides itself, for mismatch messages: a layer above the fabric that
#: makes such a call as the first step of one of its own says so (``popdist.ragged``'s exchange of shapes).
_ALSO_KNOWN_AS: dict[tuple[int, str, tuple[int, ...]], str] = {}


def name_call(kind: int, dtype: np.dtype, shape: tuple[int, ...], text: str) -> None:
    """Have mismatch messages add ``text`` to every call of this kind, dtype and shape (``Signature.describe``),
    so that a user who met one reads which of their own calls begins with it."""
    _ALSO_KNOWN_AS[(kind, np.dtype(dtype).str, tuple(shape))] = text


#: How a layer above the fabric whose collectives send their parts as point-to-point messages (mpi4py's
#: all-to-all) tells those from a user's messages: ``name_collective_messages``.
_COLLECTIVE_MESSAGES: list[Callable[[int, Sequence[bytes | bytearray]], str | None]] = []


def name_collective_messages(named: Callable[[int, Sequence[bytes | bytearray]], str | None]) -> None:
    """Have ``collective_of`` ask ``named``: given an instance and the payloads of its messages to us that the
    fabric took and nobody has received, in the order they came, the collective (as its user writes it) that
    one of them is a part of, or one of those the layer took from it itself and keeps unreceived; None if
    none is (a user's message, or another layer's)."""
    _COLLECTIVE_MESSAGES.append(named)


def collective_of(peer: int, payloads: Sequence[bytes | bytearray]) -> str | None:
    """The collective that instance ``peer``'s messages not received yet (the fabric's: ``payloads``, in the order
    they came; and the layers' above) are a part of, as the layer that sent them names it
    (``name_collective_messages``); None if none says so."""
    for named in _COLLECTIVE_MESSAGES:
        called = named(peer, payloads)
        if called is not None:
            return called
    return None


@dataclass(frozen=True)
class Signature:
    """What one instance is doing in one phase of one collective; equal on every instance or it is a mismatch."""

    kind: int
    op: int
    phase: int
    dtype: str
    shape: tuple[int, ...]
    root: int
    seq: int
    group_key: int

    def describe(self) -> str:
        name = KIND_NAMES.get(self.kind, f"collective kind {self.kind}")
        if self.kind == BARRIER:
            return name
        if self.kind == BROADCAST:
            name += f"(root={self.root})"
        elif self.kind == MESSAGE:
            name += f" of a message from instance {self.root}"
        elif self.op:
            name += f"({OP_NAMES.get(self.op, self.op)})"
        try:
            dtype = np.dtype(self.dtype).name
        except TypeError:
            dtype = repr(self.dtype)
        also = _ALSO_KNOWN_AS.get((self.kind, self.dtype, self.shape))
        return f"{name} on {dtype}[{', '.join(map(str, self.shape))}]{f' ({also})' if also else ''}"


def encode_prefix(kind: int, op: int, phase: int, dtype: str, shape: tuple[int, ...], root: int, seq: int,
                  group_key: int) -> bytes:
    """The header without its trailing payload length: what receivers compare byte for byte."""
    packer = _SHAPES[len(shape)] if len(shape) < len(_SHAPES) else struct.Struct(f"<{len(shape)}q")
    return FIXED.pack(MAGIC, kind, op, phase, len(shape), dtype.encode(), root, seq, group_key) + packer.pack(*shape)


def header_size(ndim: int) -> int:
    """The bytes of a whole header (prefix and payload length) for an ``ndim``-dimensional array."""
    return FIXED.size + 8 * ndim + NBYTES.size


class HeaderTemplate:
    """The whole header of one signature's frames (payload length included), made once by ``encode_prefix``;
    each call puts its sequence number in. For a path that sends the same signature on every call (the
    board's allreduce), with the very bytes ``Call.prefix`` gives the general path. ``tail``: a fixed payload
    carried with the header and compared with it (the shared-memory allreduce's announcement)."""

    __slots__ = ("bytes", "size")

    def __init__(self, kind: int, op: int, phase: int, dtype: str, shape: tuple[int, ...], root: int,
                 group_key: int, nbytes: int, tail: bytes = b"") -> None:
        prefix = encode_prefix(kind, op, phase, dtype, shape, root, 0, group_key)
        #: The header's bytes, each call's sequence number put in by ``at`` (or by ``put_seq`` at ``SEQ_AT``).
        self.bytes = bytearray(prefix + NBYTES.pack(len(tail) if tail else nbytes) + tail)
        #: The header's length in bytes (with the tail's).
        self.size = len(self.bytes)

    def at(self, seq: int) -> bytearray:
        """The header of call ``seq``: the template's own bytes, rewritten in place (no new bytes per call),
        so valid until the next call of ``at``."""
        _SEQ.pack_into(self.bytes, SEQ_AT, seq)
        return self.bytes


def decode_prefix(data: bytes | memoryview) -> tuple[Signature, int]:
    """Parse a header (prefix and payload length) whose bytes are all present."""
    magic, kind, op, phase, ndim, dtype, root, seq, group_key = FIXED.unpack_from(data)
    shape = struct.unpack_from(f"<{ndim}q", data, FIXED.size)
    (nbytes,) = NBYTES.unpack_from(data, FIXED.size + 8 * ndim)
    text = bytes(dtype).rstrip(b"\0").decode("ascii", "replace")
    return Signature(kind, op, phase, text, tuple(shape), root, seq, group_key), nbytes


def header_length(data: bytes | memoryview, peer: int) -> int | None:
    """The length of the header starting ``data`` (None until its fixed part is there); checks the magic."""
    if len(data) < FIXED.size:
        return None
    if bytes(data[:2]) != MAGIC:
        raise FabricError(f"the data stream from instance {peer} is corrupted (bad frame magic)")
    return header_size(data[5])


def notice_frame(kind: int, body: dict[str, object]) -> bytes:
    """A whole ABORT or MISMATCH frame."""
    payload = framing.dump_json(body, compact=False)  # the notices' bytes as they always were
    return FIXED.pack(MAGIC, kind, 0, 0, 0, b"", 0, 0, 0) + NBYTES.pack(len(payload)) + payload


class Mismatch(Exception):
    """A frame from ``peer`` whose header is not the one expected; ``exchange`` turns it into the public error."""

    def __init__(self, peer: int, theirs: Signature) -> None:
        super().__init__(peer)
        self.peer = peer
        self.theirs = theirs


def unexpected(peer: int, frame: bytes | memoryview, hlen: int, nbytes: int) -> Exception:
    """The exception for a frame from ``peer`` that is not the expected one (notices: header and body present)."""
    theirs, _ = decode_prefix(frame)
    if theirs.kind == ABORT:
        body = framing.parse_object(bytes(frame[hlen:hlen + nbytes]), "an abort notice")
        return PeerLostError(int(body["instance"]), f"{body['reason']} (reported by instance {peer})")
    if theirs.kind == MISMATCH:
        body = framing.parse_object(bytes(frame[hlen:hlen + nbytes]), "a mismatch notice")
        error = CollectiveMismatchError(f"{body['message']} (reported by instance {peer})")
        error.notice = str(body["message"])  # type: ignore[attr-defined]  # what to pass on, without the hops
        return error
    return Mismatch(peer, theirs)


def abort_notice(error: PeerLostError) -> bytes:
    return notice_frame(ABORT, {"instance": error.instance, "reason": error.reason})


def mismatch_notice(error: CollectiveMismatchError) -> bytes:
    return notice_frame(MISMATCH, {"message": getattr(error, "notice", str(error))})


def is_notice(frame: bytes | memoryview) -> bool:
    return len(frame) >= 3 and frame[2] in (ABORT, MISMATCH)


def mismatch_message(me: int, mine: Signature, peer: int, theirs: Signature, members: Sequence[int]) -> str:
    """'instance 0 called allreduce(sum) on float32[4] but instance 1 called ...', with the position if that differs.
    A receive of a message that meets a collective, and a collective that meets a message it cannot set aside, are
    named as such."""
    if theirs.kind == MESSAGE and mine.kind != MESSAGE:  # (the peer's next message is set aside: not this one)
        return (f"instance {me} called {mine.describe()} but met a message from instance {peer} out of its order "
                f"(#{theirs.seq}): the fabric's streams are out of step")
    if mine.kind == MESSAGE and theirs.kind != MESSAGE:
        return (f"instance {me} waits to receive a message from instance {peer} but instance {peer} called "
                f"{theirs.describe()} first: no message can come before instance {me} joins it")
    ours, its = mine.describe(), theirs.describe()
    if theirs.group_key != mine.group_key:
        ours += f" in group {list(members)}"
        its += " in another group"
    elif ours == its or theirs.seq != mine.seq:
        ours += f" as collective #{mine.seq} of its group"
        its += f" as collective #{theirs.seq}"
    if ours == its:  # same call, different phase: the streams are out of step
        its += f" (phase {theirs.phase}, not {mine.phase})"
    message = f"instance {me} called {ours} but instance {peer} called {its}"
    if theirs.group_key == mine.group_key and theirs.seq < mine.seq:
        message += f"; {left_unread(me, peer, theirs)}"
    return message


def met_collective_message(me: int, mine: Signature, peer: int, called: str) -> str:
    """The mismatch of a collective that waits for ``peer``'s frame and sends it nothing, where ``peer``'s message
    of its own collective ``called`` has come (``collective_of``): each waits for the other, and only this one
    can see it."""
    return (f"instance {me} called {mine.describe()} but instance {peer} called {called} first (a collective whose "
            f"blocks travel as messages: instance {peer} waits there for instance {me}'s block, and instance {me} "
            f"here for instance {peer}'s frame)")


def left_unread(me: int, peer: int, theirs: Signature) -> str:
    """Why ``peer``'s frame of a collective that instance ``me`` has passed is still unread: that collective was
    another call here, and nobody waited to compare them (a small broadcast's root writes and goes on)."""
    why = (" (the instances named different roots, or instance {me} called another collective there: a small "
           "broadcast's root writes its array to each peer and returns, so nobody compared the calls then)"
           if theirs.kind == BROADCAST else "")
    return (f"instance {me} never took that frame: its own collective #{theirs.seq} was another call"
            f"{why.format(me=me)}")


def unread_at_close(me: int, peer: int, frame: memoryview, made: Mapping[int, int]) -> Exception | None:
    """The error a fabric closing cleanly raises for ``frame``, the next one ``peer`` left in our mailbox: a
    collective's of a call we made too (``made``: our call count per group key) or a mismatch notice means
    that the instances' calls differed where nobody compared them; a message never received, a loss told
    late or a collective we never called (its sender hears that we left) is not ours to raise."""
    hlen = header_length(frame, peer)
    if hlen is None or len(frame) < hlen:
        return None
    theirs, nbytes = decode_prefix(frame)
    if theirs.kind == MISMATCH:
        return unexpected(peer, frame, hlen, nbytes)
    if theirs.kind in (MESSAGE, ABORT) or not 0 < theirs.seq <= made.get(theirs.group_key, 0):
        return None
    return CollectiveMismatchError(
        f"instance {me} closed its fabric (the end of its program, or popdist.finalizeBackend()) but instance "
        f"{peer} called {theirs.describe()} as collective #{theirs.seq} of its group; {left_unread(me, peer, theirs)}")
