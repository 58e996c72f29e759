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
from .watch import LossWatch

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


#: The peer's messages taken while a send of ours waited, in the order they came: (header, payload).
Kept = deque[tuple[Signature, bytearray]]


def send_taking(send: Send, link: Link, ours: Callable[[Signature], bool], kept: Kept, watch: LossWatch,
                sleeper: MailboxSegment | None, members: Sequence[int]) -> None:
    """Step ``send`` until its frame is out; meanwhile take the peer's frames that ``ours`` accepts into
    ``kept``. Raises ``LinkClosed`` (the caller names the instance) and what a notice says."""
    poller = select.poll()
    registered: dict[int, int] = {}
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
            wanted = {link.fd: select.POLLOUT | (_READ if reading else 0)}
            if watch.fd is not None:
                wanted[watch.fd] = select.POLLIN
            for fd, mask in wanted.items():
                if registered.get(fd) != mask:
                    poller.register(fd, mask)
                    registered[fd] = mask
            poller.poll()
        finally:
            if boxed:
                sleeper.set_sleeping(False)  # type: ignore[union-attr]


def take_message(link: Link, ours: Callable[[Signature], bool], kept: Kept, step: Callable[[], bool]) -> bool | None:
    """The link's next frame into ``kept`` if it has come and ``ours`` accepts its header (None); else True if
    a frame is there that is not ours (it stays), False if none is there yet. ``step``: our frame's, which waits
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
                return True
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
        return True
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
            poller.register(link.fd, _READ | (0 if step() else select.POLLOUT))
            poller.poll()
            continue
        except OSError as exc:
            raise LinkClosed.failed(link.peer, exc) from None
        if n == 0:
            raise LinkClosed(link.peer, _EOF)
        got += n
