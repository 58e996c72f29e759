"""Framed, nonblocking data links between instances, and the one wait loop every collective uses.

A frame is a header then ``nbytes`` of payload. The header carries the
collective's *signature* (kind, op, phase, dtype, shape, root, sequence
number, group) so that a receiver can tell, before touching the payload,
whether its peer is running the same collective; a difference becomes a
``CollectiveMismatchError`` naming both sides instead of garbage or a hang.

Every wait first retries for ~200 us without blocking (yielding the CPU),
then is a ``poll`` over the sockets involved plus the control channel's wake
fd: a peer's death shows as EOF/reset on its socket at once; a lost host
shows as a loss notice from the rendezvous (its heartbeat timeout bounds it).
A live peer that is merely late is waited for without a deadline.

A link reads ahead into a stage, so a small frame (header and payload) costs
one ``recv``; a large payload is received straight into its destination.
"""

from __future__ import annotations

import array
import json
import logging
import os
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from .errors import CollectiveMismatchError, FabricError, PeerLostError

log = logging.getLogger("poprun.fabric")

MAGIC = b"PF"
# kinds
ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER, BARRIER, ABORT = 1, 2, 3, 4, 5, 15
KIND_NAMES = {ALLREDUCE: "allreduce", BROADCAST: "broadcast", ALLGATHER: "allgather",
              REDUCE_SCATTER: "reduce_scatter", BARRIER: "barrier", ABORT: "abort"}
OP_CODES = {"sum": 1, "mean": 2, "max": 3, "min": 4, "prod": 5}
OP_NAMES = {code: name for name, code in OP_CODES.items()}

#: magic, kind, op, phase, ndim, dtype.str, root, seq, group key; then ndim x int64 shape; then uint64 nbytes
_FIXED = struct.Struct("<2sBBBB8siQQ")
_NBYTES = struct.Struct("<Q")
#: Bytes read ahead per link: a whole small frame (header and payload) arrives in one recv.
STAGE_BYTES = 256 * 1024
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_FD_SPACE = socket.CMSG_SPACE(8 * 4)
_EOF = "its connection closed (the process exited or was killed)"
_READ_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


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
        elif self.op:
            name += f"({OP_NAMES.get(self.op, self.op)})"
        try:
            dtype = np.dtype(self.dtype).name
        except TypeError:
            dtype = repr(self.dtype)
        return f"{name} on {dtype}[{', '.join(map(str, self.shape))}]"


def encode_prefix(kind: int, op: int, phase: int, dtype: str, shape: tuple[int, ...], root: int, seq: int,
                  group_key: int) -> bytes:
    """The header without its trailing payload length: what receivers compare byte for byte."""
    return _FIXED.pack(MAGIC, kind, op, phase, len(shape), dtype.encode(), root, seq, group_key) + \
        struct.pack(f"<{len(shape)}q", *shape)


def decode_prefix(data: bytes | memoryview) -> tuple[Signature, int]:
    """Parse a header (prefix and payload length) whose bytes are all present."""
    magic, kind, op, phase, ndim, dtype, root, seq, group_key = _FIXED.unpack_from(data)
    shape = struct.unpack_from(f"<{ndim}q", data, _FIXED.size)
    (nbytes,) = _NBYTES.unpack_from(data, _FIXED.size + 8 * ndim)
    text = bytes(dtype).rstrip(b"\0").decode("ascii", "replace")
    return Signature(kind, op, phase, text, tuple(shape), root, seq, group_key), nbytes


class Control(Protocol):
    wake_fd: int

    def lost(self) -> dict[int, str]: ...


class Link:
    """One peer's data connection: a nonblocking socket, the bytes read ahead, and where the outgoing stream is."""

    def __init__(self, peer: int, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.peer = peer
        self.sock = sock
        self.fd = sock.fileno()
        self.stage = bytearray(STAGE_BYTES)
        self._view = memoryview(self.stage)
        self.start = 0
        self.end = 0
        #: True while a frame has been partly sent: nothing else may be written until it is finished.
        self.mid_frame = False
        #: Same-host links can carry file descriptors (shared memory); those received wait here in order.
        self.local = sock.family == socket.AF_UNIX
        self.fds: deque[int] = deque()

    def available(self) -> int:
        return self.end - self.start

    def fill(self) -> int:
        """One nonblocking read into the stage; 0 if nothing was ready. Raises on EOF."""
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.stage):
            kept = self.end - self.start
            self._view[:kept] = self._view[self.start:self.end]
            self.start, self.end = 0, kept
        try:
            if self.local:
                n, ancillary, _, _ = self.sock.recvmsg_into([self._view[self.end:]], _FD_SPACE)
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        self.fds.extend(array.array("i", data[:len(data) - len(data) % 4]))
            else:
                n = self.sock.recv_into(self._view[self.end:])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise _Closed.failed(self.peer, exc) from None
        if n == 0:
            raise _Closed(self.peer, _EOF)
        self.end += n
        return n

    def staged(self, count: int) -> memoryview:
        return self._view[self.start:self.start + count]

    def consume(self, count: int) -> None:
        self.start += count

    def send_abort(self, instance: int, reason: str) -> None:
        """Tell the peer, if the stream is at a frame boundary, which loss stopped this instance."""
        if self.mid_frame:
            return
        body = json.dumps({"instance": instance, "reason": reason}).encode()
        header = _FIXED.pack(MAGIC, ABORT, 0, 0, 0, b"", 0, 0, 0) + _NBYTES.pack(len(body))
        try:
            self.sock.send(header + body, _NOSIGNAL)
        except OSError:
            pass
        self.mid_frame = True  # even a whole abort ends this stream's use

    def close(self) -> None:
        self.sock.close()
        while self.fds:
            os.close(self.fds.popleft())


class _Closed(Exception):
    """A peer's connection ended; ``exchange`` turns it into PeerLostError, naming the right instance."""

    def __init__(self, peer: int, reason: str) -> None:
        super().__init__(reason)
        self.peer = peer
        self.reason = reason

    @classmethod
    def failed(cls, peer: int, exc: OSError) -> _Closed:
        return cls(peer, f"its connection failed ({exc.strerror or exc})")


class Send:
    """One outgoing frame: header then payload, written as the socket accepts them."""

    __slots__ = ("link", "header", "payload", "sent", "total", "ancillary")

    def __init__(self, link: Link, header: bytes, payload: memoryview, fds: Sequence[int] = ()) -> None:
        self.link = link
        self.header = header
        self.payload = payload
        self.sent = 0
        self.total = len(header) + len(payload)
        self.ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else ()

    def step(self) -> bool:
        """Write what the socket takes now; True once the whole frame is out."""
        hlen = len(self.header)
        if self.sent < hlen:
            buffers = [self.header[self.sent:], self.payload] if len(self.payload) else [self.header[self.sent:]]
        else:
            buffers = [self.payload[self.sent - hlen:]]
        try:
            n = self.link.sock.sendmsg(buffers, self.ancillary, _NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise _Closed.failed(self.link.peer, exc) from None
        self.ancillary = ()  # the descriptors travel with the first byte
        self.sent += n
        self.link.mid_frame = self.sent < self.total
        return not self.link.mid_frame

    def header_pending(self) -> bool:
        return self.sent < len(self.header)


class Receive:
    """One incoming frame: its header is checked against ``expected`` before its payload lands in ``dest``."""

    __slots__ = ("link", "expected", "nbytes", "dest", "got", "header_done")

    def __init__(self, link: Link, expected: bytes, nbytes: int, dest: memoryview | None) -> None:
        self.link = link
        self.expected = expected
        self.nbytes = nbytes
        self.dest = dest
        self.got = 0
        self.header_done = False

    def step(self) -> bool:
        """Read what has arrived (the read-ahead first); True once the whole frame is in ``dest``."""
        link = self.link
        if not self.header_done:
            if not self._parse_header():
                link.fill()
                if not self._parse_header():
                    return False
            take = min(link.available(), self.nbytes)
            if take:
                self.dest[:take] = link.staged(take)
                link.consume(take)
                self.got = take
            if self.got == self.nbytes:
                return True
        try:
            n = link.sock.recv_into(self.dest[self.got:], self.nbytes - self.got)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise _Closed.failed(link.peer, exc) from None
        if n == 0:
            raise _Closed(link.peer, _EOF)
        self.got += n
        return self.got == self.nbytes

    def done(self) -> bool:
        return self.header_done and self.got == self.nbytes

    def _parse_header(self) -> bool:
        link = self.link
        have = link.available()
        size = len(self.expected)
        if have >= size + _NBYTES.size and link.stage.startswith(self.expected, link.start):  # the usual case
            (nbytes,) = _NBYTES.unpack_from(link.stage, link.start + size)
            if nbytes != self.nbytes:
                raise FabricError(f"instance {link.peer} sent {nbytes} bytes where {self.nbytes} were expected "
                                  "for the same collective: the fabric's streams are out of step")
            link.consume(size + _NBYTES.size)
            self.header_done = True
            return True
        if have < _FIXED.size:
            return False
        fixed = link.staged(_FIXED.size)
        if fixed[:2] != MAGIC:
            raise FabricError(f"the data stream from instance {link.peer} is corrupted (bad frame magic)")
        hlen = _FIXED.size + 8 * fixed[5] + _NBYTES.size
        if have < hlen:
            return False
        theirs, nbytes = decode_prefix(link.staged(hlen))  # a whole header, and not the expected one
        if theirs.kind == ABORT:
            if have < hlen + nbytes:
                return False
            body = json.loads(bytes(link.staged(hlen + nbytes)[hlen:]))
            raise PeerLostError(int(body["instance"]), f"{body['reason']} (reported by instance {link.peer})")
        raise _Mismatch(link.peer, theirs)


class _Mismatch(Exception):
    def __init__(self, peer: int, theirs: Signature) -> None:
        super().__init__(peer)
        self.peer = peer
        self.theirs = theirs


def mismatch_message(me: int, mine: Signature, peer: int, theirs: Signature, members: Sequence[int]) -> str:
    """'instance 0 called allreduce(sum) on float32[4] but instance 1 called ...', with the position if that differs."""
    ours, its = mine.describe(), theirs.describe()
    if theirs.group_key != mine.group_key:
        ours += f" in group {list(members)}"
        its += " in another group"
    elif ours == its or theirs.seq != mine.seq:
        ours += f" as collective #{mine.seq} of its group"
        its += f" as collective #{theirs.seq}"
    if ours == its:  # same call, different phase: the streams are out of step
        its += f" (phase {theirs.phase}, not {mine.phase})"
    return f"instance {me} called {ours} but instance {peer} called {its}"


class LossWatch:
    """Turns the control channel's wake fd into PeerLostError for the peers a wait involves.

    The wake fd stays readable after the first loss; if that loss does not
    concern the current wait, the fd is no longer polled and the loss table is
    re-read every ``RECHECK`` seconds instead (only after an unrelated loss).
    """

    RECHECK = 0.2
    EXPLAIN_WAIT = 0.5

    def __init__(self, control: Control | None) -> None:
        self.control = control
        self.fd: int | None = control.wake_fd if control is not None else None

    def check(self, among: set[int]) -> None:
        if self.control is None:
            return
        for instance, reason in sorted(self.control.lost().items()):
            if instance < 0 or instance in among:
                raise PeerLostError(instance, reason)
        if self.fd is not None:
            log.debug("fabric: a loss outside this collective; re-checking every %.1f s from now on", self.RECHECK)
        self.fd = None

    def poll_timeout_ms(self) -> int:
        return -1 if self.fd is not None or self.control is None else int(self.RECHECK * 1000)

    def explain(self, peer: int, reason: str, among: set[int]) -> PeerLostError:
        """The loss to report when ``peer``'s connection closed: the first participant the rendezvous saw die.

        A survivor that raised and exited also closes its connections, so the
        EOF we saw may be a knock-on; the rendezvous hears of a real death at
        once, so wait up to ``EXPLAIN_WAIT`` seconds for its word before
        blaming ``peer`` itself.
        """
        if self.control is None:
            return PeerLostError(peer, reason)
        deadline = time.monotonic() + self.EXPLAIN_WAIT
        while True:
            for instance, why in self.control.lost().items():
                if instance < 0 or instance in among:
                    return PeerLostError(instance, why)
            left = deadline - time.monotonic()
            if left <= 0:
                return PeerLostError(peer, reason)
            fds = [self.fd] if self.fd is not None else []
            if select.select(fds, [], [], left if fds else min(left, 0.05))[0]:
                self.fd = None  # readable for good now; only the table says more


def exchange(sends: Sequence[Send], receives: Sequence[Receive], watch: LossWatch, *, me: int,
             members: Sequence[int], mine: Callable[[], Signature], flush_timeout: float, spin: float = 0.0) -> None:
    """Move every frame; raise PeerLostError or CollectiveMismatchError rather than wait for what cannot come."""
    try:
        try:
            _move(sends, receives, watch, spin)
        except _Closed as closed:
            _salvage(receives)
            among = {r.link.peer for r in receives} | {s.link.peer for s in sends}
            raise watch.explain(closed.peer, closed.reason, among) from None
    except _Mismatch as mismatch:
        _flush_headers(sends, flush_timeout)
        raise CollectiveMismatchError(mismatch_message(me, mine(), mismatch.peer, mismatch.theirs, members)) from None


def _salvage(receives: Sequence[Receive]) -> None:
    """Read what already arrived: a mismatch or a reported loss is the cause of a peer's exit, so it wins."""
    for receive in receives:
        try:
            while not receive.done():
                before = (receive.header_done, receive.got, receive.link.available())
                if receive.step() or (receive.header_done, receive.got, receive.link.available()) == before:
                    break
        except _Closed:
            continue


def _spin(sends: list[Send], receives: list[Receive], seconds: float) -> tuple[list[Send], list[Receive]]:
    """Retry without blocking for up to ``seconds``: a peer that answers within microseconds costs no sleep
    and wake-up (~20 us here). Each retry yields the CPU, so with more instances than cores the peer we wait
    for gets to run (halves the 4 KiB latency of 4 instances on 2 cores)."""
    deadline = time.perf_counter() + seconds
    while sends or receives:
        sends = [s for s in sends if not s.step()]
        receives = [r for r in receives if not r.step()]
        if time.perf_counter() > deadline:
            break
        os.sched_yield()
    return sends, receives


def _move(sends: Sequence[Send], receives: Sequence[Receive], watch: LossWatch, spin: float) -> None:
    unsent = [s for s in sends if not s.step()]
    unreceived = [r for r in receives if not (r.link.available() and r.step())]
    if spin and (unsent or unreceived):
        unsent, unreceived = _spin(unsent, unreceived, spin)
    if not (unsent or unreceived):
        return
    pending_sends = {s.link.fd: s for s in unsent}
    pending_receives = {r.link.fd: r for r in unreceived}
    among = {r.link.peer for r in receives} | {s.link.peer for s in sends}
    poller = select.poll()
    registered: dict[int, int] = {}
    while pending_sends or pending_receives:
        wanted = {fd: select.POLLOUT for fd in pending_sends}
        for fd in pending_receives:
            wanted[fd] = wanted.get(fd, 0) | _READ_EVENTS
        if watch.fd is not None:
            wanted[watch.fd] = select.POLLIN
        for fd in [fd for fd in registered if fd not in wanted]:
            poller.unregister(fd)
            del registered[fd]
        for fd, mask in wanted.items():
            if registered.get(fd) != mask:
                poller.register(fd, mask)
                registered[fd] = mask
        for fd, events in poller.poll(watch.poll_timeout_ms()):
            if fd == watch.fd:
                watch.check(among)
                continue
            if events & _READ_EVENTS and fd in pending_receives and pending_receives[fd].step():
                del pending_receives[fd]
            if fd in pending_sends and events & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                if pending_sends[fd].step():  # raises for a failed connection
                    del pending_sends[fd]
        if watch.fd is None:
            watch.check(among)


def _flush_headers(sends: Sequence[Send], timeout: float) -> None:
    """After a mismatch, finish sending our headers so every peer sees the mismatch too (bounded)."""
    deadline = time.monotonic() + timeout
    for send in sends:
        while send.header_pending() and time.monotonic() < deadline:
            try:
                n = send.link.sock.send(send.header[send.sent:], _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                select.select([], [send.link.sock], [], max(0.0, deadline - time.monotonic()))
                continue
            except OSError:
                break
            send.sent += n
        send.link.mid_frame = True
