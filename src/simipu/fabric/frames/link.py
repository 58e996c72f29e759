"""Data links between instances: a socket, and within a host the shared-memory mailboxes beside it.

A link is a nonblocking socket to one peer (Unix within a host, TCP between
hosts) and, within a host on x86-64, a pair of shared-memory mailboxes
(``mailbox``): a frame that fits a mailbox slot goes there, any other over
the socket. Each end numbers the link's frames, so a receiver takes them in
order whichever way each came: this module alone changes those numbers
(``Link.claim`` numbers a frame going out, ``Link.took`` counts one taken;
``claim_each`` and ``Link.took_published`` do so for a board's frames, and the
board's call closures inline them: ``algorithms/board.py``), whoever moves the
frame (``post``/``take`` here, ``exchange``, the board's allreduce).
Frames are ``header``'s.

``post`` and ``take`` move a frame at once when they can (a mailbox frame
with a free slot always can); the ``Send`` or ``Receive`` they return
otherwise is stepped by ``exchange`` (exchange.py) until the frame has moved.
A link reads ahead into a stage, so a small socket frame (header and payload)
costs one ``recv``; a large payload is received straight into its destination.
"""

from __future__ import annotations

import array
import os
import socket
from collections import deque
from typing import Callable, Sequence

from ..errors import FabricError
from .header import FIXED, NBYTES, WAKE, header_length, is_notice, unexpected
from .mailbox import EMPTY, Mailbox

#: Bytes read ahead per link: a whole small frame (header and payload) arrives in one recv.
STAGE_BYTES = 256 * 1024
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_FD_SPACE = socket.CMSG_SPACE(8 * 4)
_EOF = "its connection closed (the process exited or was killed)"
_WAKE_BYTE = bytes([WAKE])


class Link:
    """One peer's data connection: a nonblocking socket, its read-ahead, and (same host) the mailboxes."""

    def __init__(self, peer: int, sock: socket.socket, mailbox: Mailbox | None = None) -> None:
        sock.setblocking(False)
        self.peer = peer
        self.sock = sock
        self.fd = sock.fileno()
        self.stage = bytearray(STAGE_BYTES)
        self._view = memoryview(self.stage)
        self.start = 0
        self.end = 0
        #: True while a frame has been partly sent, or after a notice: nothing else may be written.
        self.mid_frame = False
        #: Same-host links can carry file descriptors (shared memory); those received wait here in order.
        self.local = sock.family == socket.AF_UNIX
        self.fds: deque[int] = deque()
        self.mailbox = mailbox
        #: Frames started (the next one's index on the link) and frames taken (the index of the next one to
        #: take), both ways of travel counted. Read them anywhere; only this module changes them (``claim``,
        #: ``took``, ``claim_each``, ``took_published``), so the frame order lives here (see the module
        #: docstring). Plain attributes, not properties: the small collectives read them on every call.
        self.sent = 0
        self.received = 0
        #: Set by the engine: takes the peer's point-to-point message at the head of the link aside, for a later
        #: ``recv`` (True), when a collective's receive meets it; None, or False for a frame that is no message of
        #: ours, and the collective's receive raises the mismatch.
        self.divert: Callable[[Link], bool] | None = None

    def claim(self) -> int:
        """Number a frame this end starts sending now, whichever way it goes: its index on the link."""
        index = self.sent
        self.sent = index + 1
        return index

    def took(self) -> None:
        """The frame numbered ``received`` has been taken whole (from the socket or a mailbox slot)."""
        self.received += 1

    def took_published(self) -> None:
        """``took`` for a frame read in place from the peer's board (the mailbox counts those too, as
        ``Mailbox.consume`` does)."""
        self.mailbox.board_taken += 1  # type: ignore[union-attr]  # (a board frame came through the mailbox)
        self.received += 1

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
            raise LinkClosed.failed(self.peer, exc) from None
        if n == 0:
            raise LinkClosed(self.peer, _EOF)
        self.end += n
        return n

    def staged(self, count: int) -> memoryview:
        return self._view[self.start:self.start + count]

    def consume(self, count: int) -> None:
        self.start += count

    def skip_wakes(self) -> None:
        """Drop WAKE bytes at the front of the stage (only ever called at a frame boundary)."""
        while self.start < self.end and self.stage[self.start] == WAKE:
            self.start += 1

    def nudge(self) -> None:
        """Wake the peer sleeping in poll: one WAKE byte between frames. If the socket is full it is readable anyway."""
        if not self.mid_frame:
            try:
                self.sock.send(_WAKE_BYTE, NOSIGNAL)
            except OSError:
                pass

    def send_notice(self, frame: bytes) -> None:
        """Send an ABORT or MISMATCH frame if the stream is at a frame boundary; nothing is sent after it.

        Notices always take the socket: a receiver finds it even if this
        link's numbering has a gap from a collective that broke mid-way.
        """
        if self.mid_frame:
            return
        self.sent += 1
        try:
            self.sock.send(frame, NOSIGNAL)
        except OSError:
            pass
        self.mid_frame = True

    def close(self) -> None:
        self.sock.close()
        while self.fds:
            os.close(self.fds.popleft())


class LinkClosed(Exception):
    """A peer's connection ended; ``exchange`` turns it into PeerLostError, naming the right instance."""

    def __init__(self, peer: int, reason: str) -> None:
        super().__init__(reason)
        self.peer = peer
        self.reason = reason

    @classmethod
    def failed(cls, peer: int, exc: OSError) -> LinkClosed:
        return cls(peer, f"its connection failed ({exc.strerror or exc})")


class Send:
    """One outgoing frame: into the peer's mailbox if it fits and a slot is free, else header then payload
    written to the socket as it accepts them."""

    __slots__ = ("link", "header", "payload", "sent", "total", "ancillary", "index", "boxed")

    def __init__(self, link: Link, header: bytes, payload: memoryview, fds: Sequence[int] = (),
                 index: int | None = None) -> None:
        self.link = link
        self.header = header
        self.payload = payload
        self.sent = 0
        self.total = len(header) + len(payload)
        self.ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else ()
        self.index = link.claim() if index is None else index
        self.boxed = link.mailbox is not None and not fds and self.total <= link.mailbox.capacity

    def step(self) -> bool:
        """Write what can be written now; True once the whole frame is out."""
        if self.boxed:
            box = self.link.mailbox
            assert box is not None
            if box.try_send(self.index, self.header, self.payload):
                if box.peer_sleeping():
                    self.link.nudge()
                return True
            self.boxed = False  # both slots still unread: this frame takes the socket
        hlen = len(self.header)
        buffers: list[bytes | memoryview]
        if self.sent < hlen:
            buffers = [self.header[self.sent:], self.payload] if len(self.payload) else [self.header[self.sent:]]
        else:
            buffers = [self.payload[self.sent - hlen:]]
        try:
            n = self.link.sock.sendmsg(buffers, self.ancillary, NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise LinkClosed.failed(self.link.peer, exc) from None
        self.ancillary = ()  # the descriptors travel with the first byte
        self.sent += n
        self.link.mid_frame = self.sent < self.total
        return not self.link.mid_frame

    def header_pending(self) -> bool:
        return not self.boxed and self.sent < len(self.header)


class Receive:
    """One incoming frame: its header is checked against ``expected`` before its payload lands in ``dest``."""

    __slots__ = ("link", "expected", "nbytes", "dest", "got", "header_done", "boxed")

    def __init__(self, link: Link, expected: bytes, nbytes: int, dest: memoryview | None) -> None:
        self.link = link
        self.expected = expected
        self.nbytes = nbytes
        self.dest = dest
        self.got = 0
        self.header_done = False
        #: Expected through the mailbox: while spinning, only the mailbox is looked at (no system call).
        self.boxed = link.mailbox is not None and len(expected) + NBYTES.size + nbytes <= link.mailbox.capacity

    def step(self, read_socket: bool = True) -> bool:
        """Take what has arrived; True once the whole frame is in ``dest``. ``read_socket=False``: no recv."""
        link = self.link
        if not self.header_done:
            if not self._next_header(read_socket):
                return False
            if self.got == self.nbytes:
                return True
            take = min(link.available(), self.nbytes)
            if take:
                self.dest[:take] = link.staged(take)  # type: ignore[index]  # (None only when nbytes is 0)
                link.consume(take)
                self.got = take
            if self.got == self.nbytes:
                return True
        try:
            n = link.sock.recv_into(self.dest[self.got:], self.nbytes - self.got)  # type: ignore[index]  # (as above)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise LinkClosed.failed(link.peer, exc) from None
        if n == 0:
            raise LinkClosed(link.peer, _EOF)
        self.got += n
        return self.got == self.nbytes

    def done(self) -> bool:
        return self.header_done and self.got == self.nbytes

    def _next_header(self, read_socket: bool) -> bool:
        """Take the link's next frame header from whichever of the mailbox or the socket holds it (looking again
        after a message is set aside: the next frame may be in the other)."""
        while True:
            taken = self._next_header_once(read_socket)
            if taken is not None:
                return taken

    def _next_header_once(self, read_socket: bool) -> bool | None:
        """``_next_header``'s one look; None if a message was set aside (``Link.divert``)."""
        link, box = self.link, self.link.mailbox
        if box is not None:
            frame = box.peek(link.received)
            if frame:
                return self._take(frame)
            link.skip_wakes()
            if frame is EMPTY and not link.available():
                if not read_socket or not link.fill():
                    return False
                frame = box.peek(link.received)  # the socket's bytes were sent after any earlier mailbox frame
                if frame:
                    return self._take(frame)
        parsed = self._parse_header()
        if parsed is not False:  # (taken, or a message set aside)
            return parsed
        if not read_socket:
            return False
        link.fill()
        return self._parse_header()

    def _take(self, frame: memoryview) -> bool | None:
        if not take_boxed(self.link, frame, self.expected, self.nbytes, self.dest):
            return None  # (a message set aside: the frame looked for is the next one)
        self.header_done = True
        self.got = self.nbytes
        return True

    def _parse_header(self) -> bool | None:
        link = self.link
        link.skip_wakes()
        have = link.available()
        size = len(self.expected)
        if have >= size + NBYTES.size and link.stage.startswith(self.expected, link.start):  # the usual case
            (nbytes,) = NBYTES.unpack_from(link.stage, link.start + size)
            _check_length(link, nbytes, self.nbytes)
            link.consume(size + NBYTES.size)
            link.took()
            self.header_done = True
            return True
        hlen = header_length(link.staged(min(have, FIXED.size)), link.peer)
        if hlen is None or have < hlen:
            return False
        (nbytes,) = NBYTES.unpack_from(link.stage, link.start + hlen - NBYTES.size)
        notice = is_notice(link.staged(3))
        if notice and have < hlen + nbytes:
            return False
        if not notice and link.divert is not None and link.divert(link):
            return None  # (a message set aside: the frame looked for may be next, here or in the mailbox)
        raise unexpected(link.peer, link.staged(hlen + nbytes if notice else hlen), hlen, nbytes)



def _check_length(link: Link, nbytes: int, expected: int) -> None:
    if nbytes != expected:
        raise FabricError(f"instance {link.peer} sent {nbytes} bytes where {expected} were expected "
                          "for the same collective: the fabric's streams are out of step")


def take_boxed(link: Link, frame: memoryview, expected: bytes, nbytes: int, dest: memoryview | None) -> bool:
    """The link's next frame, whole, in the peer's mailbox slot: check it, copy its payload, free the slot. False
    if it was a point-to-point message, set aside (``Link.divert``): the frame expected is not taken yet."""
    size = len(expected)
    if frame[:size] != expected:
        if not is_notice(frame[:3]) and link.divert is not None and link.divert(link):
            return False
        hlen = header_length(frame, link.peer) or 0
        raise unexpected(link.peer, frame, hlen, NBYTES.unpack_from(frame, hlen - NBYTES.size)[0])
    _check_length(link, NBYTES.unpack_from(frame, size)[0], nbytes)
    if nbytes:
        dest[:] = frame[size + NBYTES.size:size + NBYTES.size + nbytes]  # type: ignore[index]
    link.mailbox.consume()  # type: ignore[union-attr]
    link.took()
    return True


def claim_each(links: Sequence[Link]) -> list[int]:
    """``Link.claim`` on each of ``links``: the indices of one frame published to all of them on a board
    (one call, where a method call per link would cost each small collective a few tenths of a microsecond)."""
    indices = []
    for link in links:
        index = link.sent
        link.sent = index + 1
        indices.append(index)
    return indices


def send_boxed(link: Link, header: bytes | bytearray, payload: memoryview) -> bool:
    """Write the link's next frame into its mailbox (a same-host link's) and number it; False, numbering
    nothing, while both slots are still unread (the caller retries, or a ``Send`` numbers it for the socket)."""
    if link.mailbox.try_send(link.sent, header, payload):  # type: ignore[union-attr]
        link.sent += 1
        return True
    return False


def post(link: Link, header: bytes, payload: memoryview, fds: Sequence[int] = ()) -> Send | None:
    """Send a frame now if it can go whole (None), else the Send to step until it has."""
    box = link.mailbox
    if box is not None and not fds and len(header) + len(payload) <= box.capacity:
        index = link.claim()
        if box.try_send(index, header, payload):
            if box.peer_sleeping():
                link.nudge()
            return None
        send = Send(link, header, payload, index=index)
    else:
        send = Send(link, header, payload, fds)
    return None if send.step() else send


def take(link: Link, expected: bytes, nbytes: int, dest: memoryview | None) -> Receive | None:
    """Receive a frame now if it is whole in the mailbox or the read-ahead (None), else the Receive to step."""
    box = link.mailbox
    if box is not None:
        frame = box.peek(link.received)
        if frame and take_boxed(link, frame, expected, nbytes, dest):
            return None
    receive = Receive(link, expected, nbytes, dest)
    return None if receive.step(False) else receive
