"""The one wait loop every collective uses: move a phase's frames, or raise why they cannot move.

A phase sends a frame to some peers and receives one from some (``post`` and
``take`` move most at once). What is left is retried for ~200 us without
blocking, yielding the CPU between tries (a mailbox try is a few memory
reads, no system call); then the wait sleeps in ``poll`` over the sockets
involved plus the control channel's wake fd, with this instance's mailbox
sleeping flag raised so that a peer posting to it sends a WAKE byte. Before
each sleep the loss table is read (a loss told while nobody was waiting
counts too). A peer's death shows as EOF/reset on its socket at once; a lost
host shows as a loss notice from the rendezvous (its heartbeat timeout bounds
it). A live peer that is merely late is waited for without a deadline.

Invariant the algorithms keep: when an instance returns from a collective it
has received every frame any peer sends it for that collective.
"""

from __future__ import annotations

import os
import select
import time
from typing import Callable, Sequence

from ..errors import CollectiveMismatchError
from .header import NBYTES, Mismatch, Signature, mismatch_message
from .link import NOSIGNAL, Link, LinkClosed, Receive, Send, claim_each, post, take, take_boxed
from .mailbox import EMPTY, Mailbox, MailboxSegment, Peeked, full_fence
from .watch import READ_EVENTS, FdPoll, LossWatch


def exchange(prefix: bytes, payloads: Sequence[tuple[Link, memoryview, Sequence[int]]],
             destinations: Sequence[tuple[Link, memoryview | None]], watch: LossWatch, *, me: int,
             members: Sequence[int], mine: Callable[[], Signature], flush_timeout: float, spin: float = 0.0,
             sleeper: MailboxSegment | None = None) -> None:
    """Send a frame (header ``prefix``) per payload, receive one per destination (None: an empty frame).

    Raise PeerLostError or CollectiveMismatchError rather than wait for what
    cannot come: a loss of any of ``members`` ends the wait.
    """
    sends: list[Send] = []
    receives: list[Receive] = []
    tried = 0  # destinations taken or turned into a Receive
    try:
        try:
            for link, payload, fds in payloads:
                send = post(link, prefix + NBYTES.pack(len(payload)), payload, fds)
                if send is not None:
                    sends.append(send)
            for link, dest in destinations:
                receive = take(link, prefix, 0 if dest is None else len(dest), dest)
                tried += 1
                if receive is not None:
                    receives.append(receive)
            if sends or receives:
                _move(sends, receives, watch, spin, sleeper, members)
        except LinkClosed as closed:
            _salvage(receives + [Receive(link, prefix, 0 if dest is None else len(dest), dest)
                                 for link, dest in destinations[tried:]])
            raise watch.explain(closed.peer, closed.reason, set(members) - {me}) from None
    except Mismatch as mismatch:
        _flush_headers(sends, flush_timeout)
        raise CollectiveMismatchError(mismatch_message(me, mine(), mismatch.peer, mismatch.theirs, members)) from None


def exchange_all(prefix: bytes, payload: memoryview, links: Sequence[Link], destinations: Sequence[memoryview | None],
                 watch: LossWatch, *, me: int, members: Sequence[int], mine: Callable[[], Signature],
                 flush_timeout: float, spin: float = 0.0, sleeper: MailboxSegment | None = None,
                 board: MailboxSegment | None = None) -> None:
    """``exchange`` for the most common phase: ``payload`` to every link, a frame from each (``destinations``
    in the order of ``links``). The same frames, moved with less work: written once to ``board`` (this
    instance's board, when ``links`` are every peer's and all are on this host: see ``mailbox``), else to
    each mailbox inline, taken inline, and one fence covers every peer's sleeping flag. This is the small
    collectives' hot path: with more instances than cores, every microsecond of it is paid by each of them.
    """
    header = prefix + NBYTES.pack(len(payload))
    sends: list[Send] = []
    receives: list[Receive] = []
    tried = 0
    try:
        try:
            sends = _post_to_all(header, payload, links, board)
            hlen = len(header)
            deadline = 0.0
            for link, dest in zip(links, destinations):
                box = link.mailbox
                tried += 1
                nbytes = 0 if dest is None else len(dest)
                if box is not None:
                    frame = box.peek(link.received)
                    if frame is EMPTY and spin:  # not there yet: watch the mailbox and board alone for a while
                        deadline = deadline or time.perf_counter() + spin
                        frame = _await_frame(box, link.received, deadline)
                    if frame:
                        if nbytes == len(payload) and frame[:hlen] == header:  # the usual case, checked at once
                            if nbytes:
                                dest[:] = frame[hlen:]  # type: ignore[index]
                            box.consume()
                            link.took()
                            continue
                        if take_boxed(link, frame, prefix, nbytes, dest):
                            continue  # (else a message was set aside: the frame is still to come)
                receive = Receive(link, prefix, nbytes, dest)
                if not receive.step(False):
                    receives.append(receive)
            if sends or receives:
                left = spin if not deadline else max(0.0, deadline - time.perf_counter())  # (one spin budget per call)
                _move(sends, receives, watch, left, sleeper, members)
        except LinkClosed as closed:
            _salvage(receives + [Receive(link, prefix, 0 if dest is None else len(dest), dest)
                                 for link, dest in list(zip(links, destinations))[tried:]])
            raise watch.explain(closed.peer, closed.reason, set(members) - {me}) from None
    except Mismatch as mismatch:
        _flush_headers(sends, flush_timeout)
        raise CollectiveMismatchError(mismatch_message(me, mine(), mismatch.peer, mismatch.theirs, members)) from None


def _await_frame(box: Mailbox, index: int, deadline: float) -> Peeked:
    """``box.peek(index)`` retried, yielding the CPU between tries, until it finds something or ``deadline``
    passes: a few memory reads a try, where stepping a Receive would cost a hundred times more."""
    frame: Peeked = EMPTY
    while frame is EMPTY and time.perf_counter() < deadline:
        os.sched_yield()
        frame = box.peek(index)
    return frame


def _post_to_all(header: bytes, payload: memoryview, links: Sequence[Link], board: MailboxSegment | None) -> list[Send]:
    """One frame to every link: on the board, else in each mailbox, else on each socket; then wake the peers
    asleep. Returns the sends not finished yet."""
    size = len(header) + len(payload)
    if board is not None and size <= board.board_capacity:
        board.publish(header, payload, [link.mailbox for link in links],  # type: ignore[misc]
                      claim_each(links))
        _wake_asleep(links)
        return []
    sends: list[Send] = []
    boxed: list[Link] = []
    for link in links:
        box = link.mailbox
        if box is not None and size <= box.capacity:
            index = link.claim()
            if box.try_send(index, header, payload):
                boxed.append(link)
                continue
            send = Send(link, header, payload, index=index)  # both slots unread: the socket
        else:
            send = Send(link, header, payload)
        if not send.step():
            sends.append(send)
    _wake_asleep(boxed)
    return sends


def _wake_asleep(links: Sequence[Link]) -> None:
    """After writing to these links' mailboxes or our board: a WAKE byte to each peer asleep (one fence for all)."""
    if links:
        full_fence()  # the writes, then the flags (see mailbox)
        for link in links:
            if link.mailbox.peer_asleep():  # type: ignore[union-attr]
                link.nudge()


def _salvage(receives: Sequence[Receive]) -> None:
    """Read what already arrived: a mismatch or a reported loss is the cause of a peer's exit, so it wins."""
    for receive in receives:
        try:
            while not receive.done():
                before = (receive.header_done, receive.got, receive.link.available(), receive.link.received)
                if receive.step() or before == (receive.header_done, receive.got, receive.link.available(),
                                                receive.link.received):
                    break
        except LinkClosed:
            continue


def _spin(sends: list[Send], receives: list[Receive], seconds: float) -> tuple[list[Send], list[Receive]]:
    """Retry without blocking for up to ``seconds``: a peer that answers within microseconds costs no sleep
    and wake-up (~20 us here). Each retry yields the CPU first, so with more instances than cores the peer
    we wait for gets to run."""
    deadline = time.perf_counter() + seconds
    while sends or receives:
        os.sched_yield()
        sends = [s for s in sends if not s.step()]
        receives = [r for r in receives if not r.step(not r.boxed)]
        if time.perf_counter() > deadline:
            break
    return sends, receives


def _move(sends: list[Send], receives: list[Receive], watch: LossWatch, spin: float,
          sleeper: MailboxSegment | None, members: Sequence[int]) -> None:
    """Spin, then sleep, until the pending frames have moved."""
    if spin:
        sends, receives = _spin(sends, receives, spin)
    if sends or receives:
        _sleep(sends, receives, watch, sleeper, members)


def _sleep(unsent: list[Send], unreceived: list[Receive], watch: LossWatch, sleeper: MailboxSegment | None,
           members: Sequence[int]) -> None:
    """Block in poll until every frame has moved (see the module docstring for what wakes it)."""
    pending_sends = {s.link.fd: s for s in unsent}
    pending_receives = {r.link.fd: r for r in unreceived}
    waits = FdPoll(watch)
    while pending_sends or pending_receives:
        watch.check(members)  # (drains the wake fd: a loss from now on wakes this poll)
        boxed = sleeper is not None and any(r.link.mailbox is not None for r in pending_receives.values())
        if boxed:  # from now on a peer that fills our mailbox sends a WAKE byte; frames from before are seen here
            sleeper.set_sleeping(True)  # type: ignore[union-attr]
        try:
            if boxed:
                for fd, receive in list(pending_receives.items()):
                    if receive.link.mailbox is not None and receive.step(False):
                        del pending_receives[fd]
                if not (pending_sends or pending_receives):
                    return
            wanted = {fd: select.POLLOUT for fd in pending_sends}
            for fd in pending_receives:
                wanted[fd] = wanted.get(fd, 0) | READ_EVENTS
            events = waits.poll(wanted)
        finally:
            if boxed:
                sleeper.set_sleeping(False)  # type: ignore[union-attr]
        for fd, mask in events:
            if fd == watch.fd:
                continue  # the loss table is read at the top of the loop
            if mask & READ_EVENTS and fd in pending_receives and pending_receives[fd].step():
                del pending_receives[fd]
            if fd in pending_sends and mask & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                if pending_sends[fd].step():  # raises for a failed connection
                    del pending_sends[fd]


def _flush_headers(sends: Sequence[Send], timeout: float) -> None:
    """After a mismatch, finish sending our headers so every peer sees the mismatch too (bounded)."""
    deadline = time.monotonic() + timeout
    for send in sends:
        while send.header_pending() and time.monotonic() < deadline:
            try:
                n = send.link.sock.send(send.header[send.sent:], NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                poller = select.poll()  # not select(): the fd may be above FD_SETSIZE (1024)
                poller.register(send.link.fd, select.POLLOUT)
                poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
                continue
            except OSError:
                break
            send.sent += n
        if not send.boxed:
            send.link.mid_frame = True
