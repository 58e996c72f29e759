"""The world group's small allgather and broadcast when every instance is on this host: the allreduce's boards.

An allgather moves exactly the frames an allreduce of the same array does (one
to every peer, one from each: ``sockets.allgather``), only with another kind
in the header and a copy where the allreduce reduces. So its board path is the
allreduce's (``board.BoardAllreduce``: publish once, watch one word per peer,
compare each peer's header byte for byte, read its payload in place, fall
back to the general exchange when anything is unusual), with the allgather's
header (the very bytes ``Call.prefix`` gives ``sockets.allgather``) and, in
place of the reduction, each member's array copied into its row of the
result, before the peers' publications are marked taken. With three members
or more (``many_peers_copy_call``) each peer's row is copied as soon as its
frame has passed the checks, while the later peers' frames may still be on
their way; a call that hands over to the general path has taken nothing
still, and the general path writes every row again. Determinism, the
mismatch check and the never-hang guarantee are the allreduce's.

A broadcast on the boards moves other frames than ``sockets.broadcast``
(there, the members other than the root send empty frames): here every member
publishes its whole array, so that the frames are the allreduce's shape and
its path applies unchanged; the root's is copied out. The two never meet: a
broadcast of the whole job on one host with a board-sized array takes this
path on every member (the engine decides by the call's signature and the
group's members alone), and any other broadcast never does. Publishing
an array of at most a board's size costs a copy of a few microseconds.

With three members or more a broadcast does not take the boards: there that
all-to-all is a barrier per call, and with more instances than CPUs every
call waits for each member to be scheduled in turn. ``RootBroadcast`` sends
as Open MPI's small broadcast does: the root writes its frame into each
peer's mailbox (``Mailbox.try_send``, whose slots already count what the
reader consumed, in shared memory) and returns; each other member waits for
the root's frame alone. A loop of broadcasts pipelines: the root runs up to
two calls ahead (a mailbox's two slots), then its frames take the socket. The
frames are the general path's (``exchange``), so whenever something is
unusual (the root's frame not there within the spin, another header, a
socket in between) the engine hands the call to ``exchange``, which finishes
it or raises exactly as the general path would: nothing has been taken yet.
A member that called something else sees the root's header and raises, and
its notice reaches the others in this call or their next one. A root that
called something else sends its readers nothing they can take; where that is
a collective whose parts travel as point-to-point messages (mpi4py's
all-to-all), the root's part for a reader comes where the root's frame was
due, and the reader's fallback raises on it (``Fabric._set_aside_unanswered``:
the root, waiting for the reader's part, could not see it). Members that
name different roots all return (each root writes, each reader finds its
root's frame); the frames nobody took show at the next collective, or at the
close of the fabric (``runner.PhaseRunner.close``), which raises then: a root
closing before a peer has taken its frame waits for it to, or to say why it
cannot.
"""

from __future__ import annotations

import os
import time
from typing import Callable, cast

import numpy as np

from ..frames.header import ALLGATHER, BROADCAST, SEQ_AT, HeaderTemplate, put_seq
from ..frames.link import Link, send_boxed
from ..frames.mailbox import FENCE_ACQUIRE, FENCE_RELEASE, SLEEPING, MailboxSegment
from .board import MAX_PLANS, WHOLE, BoardAllreduce, BoardAllreduces, HotCalls, publisher
from .calls import Group, byte_rows
from .phases import Phase
from .placement import Spreader
from .steady_calls import SteadyCall, hot_pair
from .waits import ALONE_SECONDS

#: With more instances than CPUs, every this many broadcasts (a power of two) an instance may move
#: (``placement``): more often than the allreduce's ``board.SPREAD_EVERY``, as the shared-memory allreduce's
#: (probes at N=4, 4 KiB: 16 beat 256 in 7 of 10 paired runs; 4 was slower).
SPREAD_BROADCASTS = 16
#: With more instances than CPUs, how long the root of a broadcast among three or more waits (yielding) for a
#: reader two calls behind to free a mailbox slot before its frame takes the socket. The spin (200 us) was too
#: short there: beside one busy process, four instances on two CPUs, the reader that needs our CPU often runs
#: only after the busy process's time slice (milliseconds); each frame then took the socket, the reader waited
#: its whole spin for a frame that was not coming to its mailbox, and every later call did the same. A 4 KiB
#: broadcast took 218-260 us a call at the median where mpi4py's took 25-30 us; with this wait, 11-24 us.
#: A reader gone or busy elsewhere costs the root this long once before the engine's fallback sends the frame.
CROWDED_ROOT_PATIENCE = 2e-3


class BoardCopies:
    """The world group's small allgathers and broadcasts on this host's boards: a plan per (root, dtype, shape)
    (root -1: an allgather), made on first use."""

    def __init__(self, allreduces: BoardAllreduces) -> None:
        # the allreduces' boards, group and spreader (one spreader per instance: it moves this process)
        self._segment: MailboxSegment = allreduces._segment
        self._group: Group = allreduces._group
        self._spreader: Spreader = allreduces._spreader
        self._hot = allreduces.hot
        #: The plans by (root rank or -1, dtype, shape); the shared-memory calls' too, once one ran
        #: (``steady_calls.SteadyCall``), so that the hot paths find them the same way.
        self.plans: dict[tuple[int, np.dtype, tuple[int, ...]], BoardAllgather | SteadyCall] = {}

    def plan_for(self, x: np.ndarray, root_rank: int = -1) -> BoardAllgather | SteadyCall | None:
        """The plan for allgathering ``x`` (checked by the engine), or broadcasting it from ``root_rank``; None
        if it does not fit a board (and no shared-memory call of it ran: ``steady_calls.SteadyCall``)."""
        key = (root_rank, x.dtype, x.shape)
        plan = self.plans.get(key)
        if plan is None and BoardAllreduce.fits(self._segment, x):
            if len(self.plans) >= MAX_PLANS:
                self.plans.clear()
            kind = BoardAllgather if root_rank < 0 else BoardBroadcast if len(self._group.members) < 3 \
                else RootBroadcast
            plan = self.plans[key] = kind(self._segment, self._group, x, self._spreader, root_rank,
                                          hot=self._hot)
        return plan

    def close(self) -> None:
        """Drop the plans (their views of the boards must go before the mailboxes close)."""
        self.plans.clear()


class BoardAllgather(BoardAllreduce):
    """One signature (dtype, shape) of the world group's allgather: ``allreduce(seq, x, spin, out)`` fills ``out``
    with every member's array in member order, or returns None as the allreduce does."""

    def __init__(self, segment: MailboxSegment, group: Group, like: np.ndarray, spreader: Spreader,
                 root_rank: int = -1, *, hot: HotCalls) -> None:
        #: The broadcast's root, as an instance index (-1: an allgather), and as a rank in the group.
        self.root = -1 if root_rank < 0 else group.members[root_rank]
        self._root_rank = root_rank
        #: The collective's kind (its header's).
        self.kind = ALLGATHER if root_rank < 0 else BROADCAST
        self.gathers = root_rank < 0  # (read by the call ``super().__init__`` makes: ``board.one_peer_call``)
        template = HeaderTemplate(self.kind, 0, Phase.FIRST, like.dtype.str, tuple(like.shape), self.root, group.key,
                                  like.nbytes)
        # (the op only names the reduction that ``reduce`` replaces; an allgather's header is an allreduce's length)
        super().__init__(segment, group, like, "sum", spreader, template=template, hot=hot)

        #: The last ``out`` and its byte views, a row per member (one for a broadcast), and the peers' rows in
        #: ``group.others`` order: see ``_rows_of``.
        self._rows_for: np.ndarray | None = None
        self._rows: list[memoryview] = []
        self._peer_rows: list[memoryview] = []
        if root_rank < 0 and len(self._links) > 1:  # (a broadcast's calls: ``take_pair``, ``RootBroadcast``)
            self.allreduce = cast("Callable[..., np.ndarray]", many_peers_copy_call(self))  # (as the base class's)

    def _rows_of(self, out: np.ndarray) -> list[memoryview]:
        """``out``'s bytes, a view per member's row (a broadcast's: one); a loop that fills one ``out`` reuses them
        (a view's copy is a third of an ndarray assignment's cost at a few KiB)."""
        if out is not self._rows_for:
            self._rows_for, self._rows = out, byte_rows(out, 1 if self.root >= 0 else out.shape[0])
            self._peer_rows = self._rows[:self._rank] + self._rows[self._rank + 1:]
        return self._rows

    def remember(self, array: np.ndarray, out: np.ndarray | None, x: np.ndarray, result: np.ndarray) -> None:
        """After the engine's checks of a call (``x``: ``array`` checked; ``result``: ``out`` if it is fit, with
        ``x`` apart from it): whether the next call with these two arrays may take the hot path, unchecked."""
        if hot_pair(array, out, x, result):
            self.checked_out, self.checked_for = out, x

    def reduce(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """``out``, each member's array copied into its row (the peers' straight from their boards)."""
        assert out is not None, "the engine passes the result"
        for k, array in enumerate(arrays):
            out[k] = array
        return out


class BoardBroadcast(BoardAllgather):
    """One signature (root, dtype, shape) of the world group's broadcast: fills ``out`` with the root's array
    (every member's frame carries its array: see the module docstring)."""

    def reduce(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """``out``, the root's array copied in (unless it is the root's own array: ``out=x`` in place)."""
        assert out is not None, "the engine passes the result"
        root = arrays[self._root_rank]
        if out is not root:
            out[...] = root
        return out

    def take_pair(self, x: np.ndarray, mine: memoryview, theirs: memoryview, out: np.ndarray) -> np.ndarray:
        """With one peer: the root's bytes into ``out`` (unless we are the root and ``out`` is our array)."""
        if self._root_rank != self._rank:
            self._rows_of(out)[0][:] = theirs
        elif out is not x:
            self._rows_of(out)[0][:] = mine
        return out


class RootBroadcast(BoardBroadcast):
    """One signature (root, dtype, shape) of the world group's broadcast among three members or more: the root's
    frame into each peer's mailbox, nothing back (see the module docstring). Its call (``allreduce``, as every
    plan's: ``root_call`` or ``reader_call``, closures with every view bound once) sends or receives, and hands
    to the engine's fallback (``HotCalls``) what did not move at once: ``unsent``, the links whose frames the
    root could not put in a mailbox, or the root's frame a non-root did not find."""

    def __init__(self, segment: MailboxSegment, group: Group, like: np.ndarray, spreader: Spreader,
                 root_rank: int = -1, *, hot: HotCalls) -> None:
        super().__init__(segment, group, like, spreader, root_rank, hot=hot)
        self.is_root = root_rank == group.rank
        #: The root's link (None on the root).
        self.root_link: Link | None = None if self.is_root else group.links[root_rank]
        #: The root's links whose frame of the last call its mailbox did not take (``exchange`` sends them).
        self.unsent: list[Link] = []
        self.allreduce = root_call(self) if self.is_root else reader_call(self)  # (the same signature)

    def resent(self, left: list[Link], header: bytearray, payload: memoryview, spin: float) -> list[Link]:
        """``left``'s frames retried, yielding the CPU between tries (the reader may need ours), for ``spin`` s;
        the links still full."""
        deadline = time.perf_counter() + spin
        while left and time.perf_counter() < deadline:
            os.sched_yield()
            left = [link for link in left if not send_boxed(link, header, payload)]
        return left


def many_peers_copy_call(plan: BoardAllgather) -> Callable[..., np.ndarray | None]:
    """An allgather's call with three members or more (``BoardAllgather.allreduce``): ``board.many_peers_call``'s
    frames and checks, and in place of the reduction each peer's bytes copied into its row of ``out`` (made by
    the caller) as soon as its frame has passed them (see the module docstring), by byte views (an ndarray row
    assignment costs about four times a view's copy here). At N=4 and 4 KiB this takes 32.4k instructions a call
    (callgrind) where ``many_peers_call`` with the rows copied after every frame had passed took 33.8k."""
    header, spreader, rank, awaited, publish = plan._header, plan._spreader, plan._rank, plan._awaited, publisher(plan)
    counter, spin, failed, fallback = plan._hot.counter, plan._hot.spin, plan._hot.failed, plan._hot.fallback
    waits, taken = plan.slots_to_take(as_bytes=True)

    def call(seq: int, x: np.ndarray, out: np.ndarray, payload: memoryview | None = None,
             sources: tuple[np.ndarray, ...] = ()) -> np.ndarray | None:
        if hot := not seq:
            seq = counter[0] = counter[0] + 1
        try:
            payload = publish(seq, x, payload)
            if out is not plan._rows_for:
                plan._rows_of(out)
            result, waited = None, False
            for (link, box, peer_words, slots, peer), row in zip(waits, plan._peer_rows):  # (``many_peers_call``'s)
                wanted = box.board_taken + 1
                publication_at, index_at, header_bytes, theirs = slots[wanted & 1]
                if peer_words[publication_at] != wanted:
                    waited = True
                    if not awaited(peer_words, publication_at, wanted, spin, peer):
                        break
                if peer_words[index_at] != link.received or header_bytes.tobytes() != header:
                    break
                row[WHOLE] = theirs
            else:
                plan._rows[rank][WHOLE] = payload
                result = out
                for link, box in taken:  # take (``took_published``, inline): their writers may reuse those slots
                    box.board_taken += 1
                    link.received += 1
                if spreader is not None and not waited:
                    os.sched_yield()  # (``many_peers_call``'s, when it published last: see board's module docstring)
        except BaseException as exc:
            if hot:
                failed(exc)
            raise
        return result if result is not None or not hot else fallback(plan, x, out)
    return call


def root_call(plan: RootBroadcast) -> Callable[..., np.ndarray]:
    """The root's call ``seq`` (0: the next, numbered here): ``x`` into each peer's mailbox, and into ``out``
    (made by the caller); a peer whose both slots are still unread (it is two calls behind) is retried for the
    spin (with more instances than CPUs, ``CROWDED_ROOT_PATIENCE``), then its frame is the engine's fallback's to
    send (``unsent``), by the socket."""
    hooks, spreader, crowded, header = plan._hot, plan._spreader, plan._crowded, plan._header
    counter, spin, failed, fallback = hooks.counter, hooks.spin, hooks.failed, hooks.fallback
    total, hlen = plan._total, len(plan._header)
    links, patience = plan._links, CROWDED_ROOT_PATIENCE if crowded else spin
    senders = tuple((link, link.mailbox.fixed_sender(hlen, total))  # type: ignore[union-attr]  # (same host)
                    for link in links)
    sleepers = tuple(zip(plan._flags, [link.nudge for link in links]))

    def call(seq: int, x: np.ndarray, out: np.ndarray | None = None, payload: memoryview | None = None,
             sources: tuple[np.ndarray, ...] = ()) -> np.ndarray:
        if not seq:
            seq = counter[0] = counter[0] + 1
        assert out is not None, "the engine passes the result"
        try:
            if spreader is not None and not seq % SPREAD_BROADCASTS:
                spreader.spread()  # (as the allreduce's: ``placement``)
            put_seq(header, SEQ_AT, seq)
            payload = plan._x_bytes if x is plan._x else plan.bytes_of(x)
            left = []
            for link, send in senders:
                if send(link.sent, header, payload):  # (``send_boxed``, with the sizes' views bound once)
                    link.claim()
                else:
                    left.append(link)  # (numbered later: here, or by ``exchange``)
            if left:  # a reader two calls behind: wait for a slot a while (a socket frame costs both ends calls)
                left = plan.resent(left, header, payload, patience)
            plan.unsent = left
            FENCE_ACQUIRE()  # (``full_fence``: the frames, then the sleeping flags: see mailbox)
            FENCE_RELEASE()
            for flag, nudge in sleepers:
                if flag[SLEEPING]:
                    nudge()
            if out is not x:
                (plan._rows if out is plan._rows_for else plan._rows_of(out))[0][:] = payload
            if crowded:
                os.sched_yield()  # (a reader on our CPU takes this frame before we race into the next call)
        except BaseException as exc:
            failed(exc)
            raise
        return out if not left else fallback(plan, x, out)
    return call


def reader_call(plan: RootBroadcast) -> Callable[..., np.ndarray]:
    """A non-root's call ``seq`` (0: the next, numbered here): the root's frame, checked and copied into ``out``
    (made by the caller); if it is not next in the root's mailbox with this call's header within the spin,
    nothing is taken and the engine's fallback receives it (or raises why it cannot)."""
    hooks, spreader, crowded, header = plan._hot, plan._spreader, plan._crowded, plan._header
    counter, spin, failed, fallback = hooks.counter, hooks.spin, hooks.failed, hooks.fallback
    link = plan.root_link
    assert link is not None and link.mailbox is not None, "a reader of a root on this host"
    take = link.mailbox.fixed_receiver(len(header), plan._total)
    beside, root_header = plan._beside, link.mailbox.reader_views()[0]

    def call(seq: int, x: np.ndarray, out: np.ndarray | None = None, payload: memoryview | None = None,
             sources: tuple[np.ndarray, ...] = ()) -> np.ndarray:
        if not seq:
            seq = counter[0] = counter[0] + 1
        assert out is not None, "the engine passes the result"
        try:
            if spreader is not None and not seq % SPREAD_BROADCASTS:
                spreader.spread()
            put_seq(header, SEQ_AT, seq)
            dest = (plan._rows if out is plan._rows_for else plan._rows_of(out))[0]
            done = take(link.received, header, dest)
            if not done:
                start = time.perf_counter()
                alone_until = start if crowded or beside(root_header) else start + min(ALONE_SECONDS, spin)
                deadline = start + spin
                while not done and (now := time.perf_counter()) < deadline:
                    if now > alone_until:  # (``waits.alone_waiter`` and ``await_crowded``)
                        os.sched_yield()
                    done = take(link.received, header, dest)
            if done:
                link.took()
                if crowded:
                    os.sched_yield()
        except BaseException as exc:
            failed(exc)
            raise
        return out if done else fallback(plan, x, out)
    return call
