"""Point-to-point messages that never wait on each other (``engine.Fabric.send``/``recv``).

A message is one frame on the link between two instances. It goes at once
when the link has room (a mailbox slot, the socket's buffer). When it has
not, the sender waits for room, and meanwhile takes every peer's messages to
it that arrive and keeps them (``Kept``) for its own later ``recv``: so two
instances that each send the other more than the link holds, before either
receives, both finish, and so does a ring of such sends, as MPI's progress
engine lets them. Anything else a peer sends (a collective's frame) stays
where it is, for whoever expects it; a notice (the peer's mismatch or a loss
it saw) raises here. A wait for the first message of several peers
(``take_first``: mpi4py's ``ANY_SOURCE``) looks at their links the same way,
and meanwhile takes the other peers' messages too: a receive from one peer
never leaves another waiting for room for a message to us.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .header import ABORT, FIXED, MISMATCH, WAKE, Signature, decode_prefix, header_length, unexpected
from .link import _EOF, Link, LinkClosed, Send
from .mailbox import ELSEWHERE, EMPTY, Mailbox, MailboxSegment, Peeked
from .watch import READ_EVENTS, FdPoll, LossWatch

#: The peer's messages taken while a send of ours waited, in the order they came: (header, payload).
Kept = deque[tuple[Signature, bytearray]]


#: A peer's link as a wait for messages sees it: the link, whether a header is that peer's next message to us
#: (``engine.Fabric._next_message_from``), and where its messages taken early go.
Source = tuple[Link, Callable[[Signature], bool], Kept]


@dataclass
class Look:
    """One look at every source's link (``look``): the position of one with a message (kept, or taken now), or
    None; the links to poll for reading; by position, the header of a frame first that is not a message (its
    peer waits in a collective with us, or made that call and has ended since: a small broadcast's root writes
    and returns) and how a closed link closed (nothing more can come on it)."""

    found: int | None = None
    reading: list[Link] = field(default_factory=list)
    calls: dict[int, Signature] = field(default_factory=dict)
    closed: dict[int, LinkClosed] = field(default_factory=dict)


def look(sources: Sequence[Source], mine: OurFrame, counted: int | None = None) -> Look:
    """Each source's link once, in order, until one has a message (see ``Look``): for the first ``counted``
    sources (all by default) one kept already counts, for the rest only one taken now does. ``mine``: our frame
    that waits for room, if one does (``take_message``). A notice behind a frame that is not ours raises what
    it says."""
    seen = Look()
    counted = len(sources) if counted is None else counted
    for position, (link, ours, kept) in enumerate(sources):
        if kept and position < counted:
            seen.found = position
            return seen
        other: Signature | bool | None = False
        try:
            other = take_message(link, ours, kept, mine)
            if other is None:
                seen.found = position
                return seen
            if other:  # a frame not ours comes first: a notice may follow it (the peer saw a mismatch)
                raise_notice_ahead(link)
        except LinkClosed as closed:
            if isinstance(other, Signature):  # (its peer called that collective, and has ended since)
                seen.calls[position] = other
            else:
                seen.closed[position] = closed
            continue
        if isinstance(other, Signature):
            seen.calls[position] = other
        # (read more only while the stage has room: a frame not ours stays there, and its bytes would wake the
        # poll again and again)
        if not other or link.end < len(link.stage):
            seen.reading.append(link)
    return seen


class OurFrame:
    """Our frame waiting for room on its link (``send_taking``), stepped while we take the peers' frames, so that
    a peer waiting for room for its own, and reading ours meanwhile, is never left waiting on us. ``None``'s:
    no frame of ours waits."""

    def __init__(self, send: Send | None = None, link: Link | None = None) -> None:
        self._send, self._link = send, link
        self.done = send is None

    def step(self) -> bool:
        """``send.step()`` until the frame is out, never after (a mailbox frame would go twice): whether it is."""
        if not self.done:
            self.done = _stepped(self._send, self._link)  # type: ignore[arg-type]
        return self.done

    def wanted(self) -> dict[int, int]:
        """What to poll for while it waits: room on its link."""
        return {} if self.done else {self._link.fd: select.POLLOUT}  # type: ignore[union-attr]


def send_taking(send: Send, link: Link, sources: Sequence[Source], watch: LossWatch,
                sleeper: MailboxSegment | None, members: Sequence[int]) -> None:
    """Step ``send`` (on ``link``) until its frame is out; meanwhile take every source's messages (each peer's
    link: the one we send on, and the others, so that a ring of sends each waiting for room turns) into its
    kept queue. Raises ``LinkClosed`` for ``link`` (the caller names the instance) and what a notice says."""
    waits = FdPoll(watch)
    mine = OurFrame(send, link)
    position = next(k for k, (source, _, _) in enumerate(sources) if source is link)
    while not mine.step():
        seen = look(sources, mine, counted=0)
        if seen.found is not None:
            continue  # (took one: look for the next at once)
        if position in seen.closed:
            raise seen.closed[position]
        _sleep(sources, mine, 0, waits, watch, sleeper, members)


def _sleep(sources: Sequence[Source], mine: OurFrame, counted: int, waits: FdPoll, watch: LossWatch,
           sleeper: MailboxSegment | None, members: Sequence[int],
           check: Callable[[Look], None] | None = None) -> int | None:
    """Block in poll until a source's link may bring a frame (or ``mine`` may have room), with our sleeping
    flag raised so that a peer writing our mailbox wakes us; first, one more ``look`` (``counted`` as there)
    for what came before the flag was raised: the position of a source with a message if it found one
    (``check`` sees it if not)."""
    watch.check(members)
    boxed = sleeper is not None and any(link.mailbox is not None for link, _, _ in sources)
    if boxed:  # a frame a peer puts in our mailbox from now on comes with a WAKE byte
        sleeper.set_sleeping(True)  # type: ignore[union-attr]
    try:
        seen = look(sources, mine, counted)
        if seen.found is not None:
            return seen.found
        if check is not None:
            check(seen)
        wanted = {link.fd: READ_EVENTS for link in seen.reading}
        for fd, mask in mine.wanted().items():
            wanted[fd] = wanted.get(fd, 0) | mask
        waits.poll(wanted)
        return None
    finally:
        if boxed:
            sleeper.set_sleeping(False)  # type: ignore[union-attr]


def take_message(link: Link, ours: Callable[[Signature], bool], kept: Kept,
                 mine: OurFrame) -> Signature | bool | None:
    """The link's next frame into ``kept`` if it has come and ``ours`` accepts its header (None); else the header
    of a frame that is there and not ours (it stays), False if none is there yet. ``mine``: our frame that waits
    for room, stepped while a payload is read (the peer may be waiting for room for it, reading ours)."""
    box = link.mailbox
    if box is not None:
        frame = box.peek(link.received)
        if frame is EMPTY:  # (no WAKE byte is read after the last look at the mailbox: see ``_awake``)
            frame = _awake(link, box)
            if frame is EMPTY:
                return False
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
    _read_rest(link, memoryview(payload), got, mine)
    kept.append((theirs, payload))
    return None


def _awake(link: Link, box: Mailbox) -> Peeked:
    """After the mailbox was found empty: what the socket brings, and then the mailbox again, since a WAKE byte
    is sent after the frame it announces is written. EMPTY if neither brought a frame (part of one on the
    socket, or the mailbox's, else). Reading a WAKE byte without looking again would lose it: a peer that wrote
    its frame just after that look, and saw us asleep, sends one, and we would sleep until another came."""
    link.skip_wakes()
    if link.available():
        return ELSEWHERE  # (part of a frame from the socket: the next one is there)
    if not link.fill():
        return EMPTY  # (nothing came: a WAKE byte sent from now on stays in the socket, for the poll)
    link.skip_wakes()
    frame = box.peek(link.received)
    return ELSEWHERE if frame is EMPTY and link.available() else frame


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


def _read_rest(link: Link, payload: memoryview, got: int, mine: OurFrame) -> None:
    """The rest of a payload the peer is writing now. It may be waiting, as we were, for room for it, taking
    our frame meanwhile: so ours is stepped too, or the two would each wait to read the other's (and so may a
    ring of peers, each reading the one before while the next reads it)."""
    poller = select.poll()
    registered: set[int] = set()
    while got < len(payload):
        try:
            n = link.sock.recv_into(payload[got:])
        except (BlockingIOError, InterruptedError):
            mine.step()
            wanted = mine.wanted()
            wanted[link.fd] = wanted.get(link.fd, 0) | READ_EVENTS
            for fd in registered - set(wanted):
                poller.unregister(fd)
            for fd, mask in wanted.items():
                poller.register(fd, mask)  # (again: the same fd's mask replaced)
            registered = set(wanted)
            poller.poll()
            continue
        except OSError as exc:
            raise LinkClosed.failed(link.peer, exc) from None
        if n == 0:
            raise LinkClosed(link.peer, _EOF)
        got += n


#: ``take_first``'s: no frame of ours waits for room.
NOTHING_WAITS = OurFrame()


class NoMessageCanCome(Exception):
    """Every link waited on has a frame first that is not a message (its peer waits in a collective with us), or
    has closed: ``calls`` by position in the sources, the header of that frame."""

    def __init__(self, calls: dict[int, Signature]) -> None:
        super().__init__(calls)
        self.calls = calls


def take_first(sources: Sequence[Source], watch: LossWatch, sleeper: MailboxSegment | None, members: Sequence[int],
               block: bool, others: Sequence[Source] = (), spin: float = 0.0, must: int | None = None) -> int | None:
    """The position in ``sources`` of the first whose next message has come: already kept, or taken now into its
    ``kept``. None if none has and not ``block``; with ``block``, waits for one, taking meanwhile the messages
    that come from ``others`` into their kept queues (so that a peer waiting for room for one to us goes on,
    as MPI's progress engine lets it; a ``recv`` takes them later). A link that has closed is passed over (its
    peer has finished: what it sent first was taken). Raises ``NoMessageCanCome`` when no link of ``sources``
    can bring one (every one has a collective's frame first, or has closed, and one at least a collective's),
    the first one's ``LinkClosed`` when all have closed, and what a notice on any link says. A wait first looks
    again for ``spin`` seconds, yielding the CPU between looks, as the collectives do (``exchange._spin``): a
    message that comes within it is taken without the sleep and the wake-up, which cost a reply tens of
    microseconds. ``must``: how many of the first ``sources`` the wait is for (the rest only wake it), the
    ones ``NoMessageCanCome`` is about (default: all)."""
    waits = FdPoll(watch)
    wanted = len(sources)
    every = [*sources, *others]
    needed = wanted if must is None else must

    def check(seen: Look) -> None:
        _raise_if_none_can_come(seen, needed)
    deadline = 0.0
    while True:
        seen = look(sources, NOTHING_WAITS)
        if seen.found is not None:
            return seen.found
        if not block:
            return None
        check(seen)
        if spin:
            now = time.perf_counter()
            deadline = deadline or now + spin
            if now < deadline:
                os.sched_yield()
                continue
        found = _sleep(every, NOTHING_WAITS, wanted, waits, watch, sleeper, members, check)
        if found is not None and found < wanted:
            return found  # (one of ``others``: taken; look again at once)


def _raise_if_none_can_come(seen: Look, wanted: int) -> None:
    """``take_first``'s end when none of the first ``wanted`` sources can send: each waits in a collective with
    us, or has closed."""
    calls = {k: call for k, call in seen.calls.items() if k < wanted}
    closed = {k: link for k, link in seen.closed.items() if k < wanted}
    if len(calls) + len(closed) < wanted:
        return
    if calls:
        raise NoMessageCanCome(calls)
    raise closed[min(closed)]
