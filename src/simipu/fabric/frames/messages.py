"""Point-to-point messages that never wait on each other (``engine.Fabric.send``/``recv``).

A message is one frame on the link between two instances. It goes at once
when the link has room (a mailbox slot, the socket's buffer). When it has
not, the sender waits for room, and meanwhile takes the peer's messages to it
that arrive and keeps them (``Kept``) for its own later ``recv``: so two
instances that each send the other more than the link holds, before either
receives, both finish, as MPI's progress engine lets them. Anything else the
peer sends (a collective's frame) stays where it is, for whoever expects it;
a notice (the peer's mismatch or a loss it saw) raises here.
"""

from __future__ import annotations

import select
from collections import deque
from typing import Callable, Sequence

from .header import ABORT, FIXED, MISMATCH, WAKE, Signature, decode_prefix, header_length, unexpected
from .link import _EOF, Link, LinkClosed, Send
from .mailbox import EMPTY, MailboxSegment
from .watch import READ_EVENTS, FdPoll, LossWatch

#: The peer's messages taken while a send of ours waited, in the order they came: (header, payload).
Kept = deque[tuple[Signature, bytearray]]


def send_taking(send: Send, link: Link, ours: Callable[[Signature], bool], kept: Kept, watch: LossWatch,
                sleeper: MailboxSegment | None, members: Sequence[int]) -> None:
    """Step ``send`` until its frame is out; meanwhile take the peer's frames that ``ours`` accepts into
    ``kept``. Raises ``LinkClosed`` (the caller names the instance) and what a notice says."""
    waits = FdPoll(watch)
    done = False

    def step() -> bool:
        """``send.step()`` until it is out, never after (a mailbox frame would go twice)."""
        nonlocal done
        done = done or _stepped(send, link)
        return done

    while not step():
        if take_message(link, ours, kept, step) is None:
            continue  # (took one: look for the next at once)
        watch.check(members)
        boxed = sleeper is not None and link.mailbox is not None
        if boxed:  # a frame the peer puts in our mailbox from now on comes with a WAKE byte
            sleeper.set_sleeping(True)  # type: ignore[union-attr]
        try:
            other = take_message(link, ours, kept, step)  # (again: what came before the flag was raised)
            if other is None:
                continue
            if other:  # a frame not ours comes first: a notice may follow it (the peer saw the mismatch)
                raise_notice_ahead(link)
            # (read more only while the stage has room: a frame not ours stays there, and its bytes would wake
            # the poll again and again)
            reading = not other or link.end < len(link.stage)
            waits.poll({link.fd: select.POLLOUT | (READ_EVENTS if reading else 0)})
        finally:
            if boxed:
                sleeper.set_sleeping(False)  # type: ignore[union-attr]


def take_message(link: Link, ours: Callable[[Signature], bool], kept: Kept,
                 step: Callable[[], bool]) -> Signature | bool | None:
    """The link's next frame into ``kept`` if it has come and ``ours`` accepts its header (None); else the header
    of a frame that is there and not ours (it stays), False if none is there yet. ``step``: our frame's, which waits
    for room, called while a payload is read (the peer may be waiting for room for it, reading ours)."""
    box = link.mailbox
    if box is not None:
        frame = box.peek(link.received)
        if frame is EMPTY and not link.available():
            link.fill()  # (the socket's bytes were sent after any earlier mailbox frame: look again)
            frame = box.peek(link.received)
        if frame:
            start = header_length(frame, link.peer) or 0
            theirs, nbytes = decode_prefix(frame)
            if theirs.kind in (ABORT, MISMATCH):
                raise unexpected(link.peer, frame, start, nbytes)
            if not ours(theirs):
                return theirs
            kept.append((theirs, bytearray(frame[start:start + nbytes])))
            box.consume()
            link.took()
            return None
    link.skip_wakes()
    hlen = _staged_header(link)
    if hlen is None:
        return False
    theirs, nbytes = decode_prefix(link.staged(hlen))
    if theirs.kind in (ABORT, MISMATCH):
        if link.available() < hlen + nbytes:
            link.fill()  # (a notice is small: read on until it is whole, one read a try)
            return False
        raise unexpected(link.peer, link.staged(hlen + nbytes), hlen, nbytes)
    if not ours(theirs):
        return theirs
    link.consume(hlen)
    link.took()
    payload = bytearray(nbytes)
    got = min(link.available(), nbytes)
    payload[:got] = link.staged(got)
    link.consume(got)
    _read_rest(link, memoryview(payload), got, step)
    kept.append((theirs, payload))
    return None


def _staged_header(link: Link) -> int | None:
    """The length of the whole header at the front of the stage, reading the socket for it (once) if it is not
    all there; None if it is not yet. (Waiting in poll for the rest while the stage holds a part, unread
    bytes in the socket would wake the poll again and again.)"""
    hlen = header_length(link.staged(min(link.available(), FIXED.size)), link.peer)
    if hlen is not None and link.available() >= hlen:
        return hlen
    if not link.fill():
        return None
    link.skip_wakes()
    hlen = header_length(link.staged(min(link.available(), FIXED.size)), link.peer)
    return hlen if hlen is not None and link.available() >= hlen else None


def _stepped(send: Send, link: Link) -> bool:
    """``send.step()``; if the peer has gone, what it said first, if it said why (a mismatch it found)."""
    try:
        return send.step()
    except LinkClosed:
        try:
            raise_notice_ahead(link)
        except LinkClosed:
            pass
        raise


def raise_notice_ahead(link: Link) -> None:
    """Raise what a notice says if one is on the socket behind frames not ours: the peer sends one when it
    finds a mismatch (such as a collective meeting our message), and we would otherwise wait for room until
    its process ends."""
    if link.start or link.end < len(link.stage):  # (a full stage has no room to read into: ``fill`` would see EOF)
        link.fill()
    at = link.start
    while at < link.end:
        while at < link.end and link.stage[at] == WAKE:
            at += 1
        have = link.end - at
        view = memoryview(link.stage)[at:link.end]
        hlen = header_length(view[:min(have, FIXED.size)], link.peer)
        if hlen is None or have < hlen:
            return
        theirs, nbytes = decode_prefix(view[:hlen])
        if have < hlen + nbytes:
            return
        if theirs.kind in (ABORT, MISMATCH):
            raise unexpected(link.peer, view[:hlen + nbytes], hlen, nbytes)
        at += hlen + nbytes


def _read_rest(link: Link, payload: memoryview, got: int, step: Callable[[], bool]) -> None:
    """The rest of a payload the peer is writing now. It may be waiting, as we were, for room for it, taking
    our frame meanwhile: so ours is stepped too, or the two would each wait to read the other's."""
    poller = select.poll()
    while got < len(payload):
        try:
            n = link.sock.recv_into(payload[got:])
        except (BlockingIOError, InterruptedError):
            poller.register(link.fd, READ_EVENTS | (0 if step() else select.POLLOUT))
            poller.poll()
            continue
        except OSError as exc:
            raise LinkClosed.failed(link.peer, exc) from None
        if n == 0:
            raise LinkClosed(link.peer, _EOF)
        got += n


class NoMessageCanCome(Exception):
    """Every link waited on has a frame first that is not a message (each peer waits in a collective with us):
    ``calls`` by position in the sources, the header of that frame."""

    def __init__(self, calls: dict[int, Signature]) -> None:
        super().__init__(calls)
        self.calls = calls


def take_first(sources: Sequence[tuple[Link, Callable[[Signature], bool], Kept]], watch: LossWatch,
               sleeper: MailboxSegment | None, members: Sequence[int], block: bool) -> int | None:
    """The position in ``sources`` of the first whose next message has come: already kept, or taken now into its
    ``kept`` if ``ours`` accepts its header. None if none has and not ``block``; with ``block``, waits for one.
    Raises ``NoMessageCanCome`` when each link has a frame first that is not a message (its peer waits in a
    collective, which waits on us), ``LinkClosed`` and what a notice says."""
    waits = FdPoll(watch)
    while True:
        found, quiet, calls = _first_taken(sources)
        if found is not None:
            return found
        if not block:
            return None
        if sources and not quiet:
            raise NoMessageCanCome(calls)
        watch.check(members)
        boxed = sleeper is not None and any(link.mailbox is not None for link, _, _ in sources)
        if boxed:  # a frame a peer puts in our mailbox from now on comes with a WAKE byte
            sleeper.set_sleeping(True)  # type: ignore[union-attr]
        try:
            found, quiet, calls = _first_taken(sources)  # (again: what came before the flag was raised)
            if found is not None:
                return found
            if sources and not quiet:
                raise NoMessageCanCome(calls)
            # (links with a frame not ours first stay out: their unread bytes would wake the poll again and again)
            waits.poll({link.fd: READ_EVENTS for link in quiet})
        finally:
            if boxed:
                sleeper.set_sleeping(False)  # type: ignore[union-attr]


def _first_taken(sources: Sequence[tuple[Link, Callable[[Signature], bool], Kept]]
                 ) -> tuple[int | None, list[Link], dict[int, Signature]]:
    """``take_first``'s look at every link once: (the position of one with a message, or None; the links with
    nothing yet; by position, the header of a frame first that is not a message)."""
    quiet: list[Link] = []
    calls: dict[int, Signature] = {}
    for position, (link, ours, kept) in enumerate(sources):
        if kept:
            return position, quiet, calls
        other = take_message(link, ours, kept, _nothing_to_send)
        if other is None:
            return position, quiet, calls
        if isinstance(other, Signature):
            raise_notice_ahead(link)  # (the peer may have said why it stopped: a mismatch it found)
            calls[position] = other
        else:
            quiet.append(link)
    return None, quiet, calls


def _nothing_to_send() -> bool:
    """``take_message``'s ``step`` when no frame of ours waits for room."""
    return True
