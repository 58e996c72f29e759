"""The world group's small allreduce when every instance is on this host: one publication, read in place.

This is the collective a data-parallel training step calls most, on arrays of
a few KiB, and with more instances than cores every microsecond of Python in
it is paid by each instance in turn (see the README's benchmark). So it moves
exactly the frames the general path would (``frames.exchange.exchange_all``
with a board: see ``frames.mailbox``), with a fraction of the work: the header
is made once per signature (``frames.header.HeaderTemplate``: the general
path's own bytes, each call's sequence number put in), the frame is numbered
by its links (as ``frames.link.claim_each`` does) and published on our board,
each peer's publication is awaited by watching one word, its header is
compared byte for byte, and the reduction reads the peers' payloads straight
from their boards (``board_frame_at`` aligns them), in member order, before
they are marked taken (as ``frames.link.Link.took_published`` does). Whenever that does not
apply (a peer's next frame is not this call's on its board within the spin:
it is late, or it called something else, or it is gone) the engine hands the
receiving to ``exchange``, which finishes the call or raises exactly as the
general path would: nothing has been taken yet.

The hot paths (``Fabric.allreduce``, and ``popdist.collectives.allreduce`` a
frame above it: ``PlannedPaths.hot_allreduces``) look the plan up by
signature and call it with seq 0, so that it numbers the call itself
(``HotCalls``), checking nothing else: a plan is made only for a checked
array, an ``out`` only after it was checked with that very array, and the
plans go when the fabric breaks or closes. The call is a closure, one frame
with every constant bound once, for each instance pays every lookup on every
step: ``many_peers_call``'s (at N=4 and 4 KiB, 0.7 of the instructions of the
method calls before for an allgather, 0.8 for an allreduce, counted by
callgrind), or with one peer (a job of two instances) ``one_peer_call``'s,
the same steps unrolled, no loop (at 4 KiB, about 1.9 us a call against 2.8
us before).

With more instances on the host than CPUs, two more things
(``algorithms.placement``): every ``SPREAD_EVERY``-th call
(``SPREAD_SHARED``-th for the shared-memory plans) lets the ``Spreader``
move a crowded instance to a quieter CPU, and a call that found every
peer's frame there at once ends by yielding once: it published last, so a
peer on our CPU may still have this call's reduction to do, and runs it before we race into the next
call and spin on its publication (every instance's call then takes about one
round, rather than one call none and the next two). A call that had to wait
for a frame does not yield at its end: it yielded while it waited, so a peer
on our CPU has run since and published (and finished, if it could), and one
more yield would only swap the two again, a context switch more per call for
each CPU. At N=4 and 4 KiB on 2 CPUs that took the slowest instance's time
a call from about 18-22 us to 12-13 us (against yielding after every call;
never yielding was 15-21 us). The shared-memory allreduces and copies do both
too, but yield after every call (``planned.PlannedPaths._settle``, and their
plans here: ``sources``): there a call's work after its phase is the copies
and the reduction of the whole array, and letting one racer skip the yield
made a 256 KiB allreduce and broadcast at N=4 take 1.14x and 1.18x as long.

With a CPU for each instance, a wait for a peer only reads for its first
``ALONE_SECONDS`` (``waits``), then yields between reads: the kernel may still put two
instances on one CPU (another process holds the other), and then the peer
runs only when we let it. So a wait first says which CPU it is on, and if the
peer it waits for last said the same, the later of the two by position moves
to the CPU with fewest of the host's instances (``Spreader.beside``), and the
other yields at once until it has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, cast

import numpy as np

from ..frames.header import ALLREDUCE, OP_CODES, SEQ_AT, HeaderTemplate, header_size, put_seq
from ..frames.mailbox import (
    FENCE_ACQUIRE,
    FENCE_RELEASE,
    INDICES,
    LENGTH,
    OFFSET,
    PUBLICATION,
    SLEEPING,
    Mailbox,
    MailboxSegment,
    board_frame_at,
)
from .calls import UFUNCS, Group, reduce_in_order
from .phases import Phase
from .placement import Spreader
from .steady_calls import SteadyCall
from .waits import Await, alone_waiter, await_crowded

#: With more instances than CPUs, every this many calls (a power of two) an instance may move (``placement``).
SPREAD_EVERY = 256
#: The same for the shared-memory plans (``BoardAllreduces.shared_plan``, ``shared_copies_board``) and the shm
#: allreduce's general path: a call of theirs is long, so a bad placement costs more calls' time, and a move is
#: a small part of a call. With the plans at 256, a 256 KiB broadcast at N=4 on 2 CPUs kept three instances on
#: one CPU for whole runs of 400 calls (75-85 us a call in some launches, 140-180 us in others); at 16, 80-88 us.
SPREAD_SHARED = 16
#: Plans kept per fabric; beyond, the cache starts again (a program that allreduces ever new shapes).
MAX_PLANS = 64


@dataclass(frozen=True)
class HotCalls:
    """What a plan's hot call (seq 0) needs of the engine: it numbers itself and, on its own, hands a late call
    to the general path or marks the fabric broken, so that its caller is a plain call (one frame fewer above
    it, a tenth of a small call: ``popdist.collectives`` calls it straight)."""

    #: The world group's call counter (the engine's).
    counter: list[int]
    #: How long a call waits for a peer's frame before the general path receives it, in seconds.
    spin: float
    #: ``(exc)``: a call raised; the fabric is unusable from now on.
    failed: Callable[[BaseException], None]
    #: ``(plan, x, out) -> result``: the call just numbered, published, whose peers' frames were not all there.
    fallback: Callable[..., np.ndarray]


#: ``b[WHOLE] = a`` copies as ``b[:] = a`` does, without building the slice on each call (CPython 3.11 makes one per
#: ``[:]``: a few hundredths of a 4 KiB call in ``one_peer_call``, which has four).
WHOLE = slice(None)


class BoardAllreduces:
    """The world group's small allreduces on this host's boards: a plan per signature, made on first use."""

    def __init__(self, segment: MailboxSegment, group: Group, hot: HotCalls) -> None:
        self._segment = segment
        self._group = group
        #: What each plan's hot call needs of the engine.
        self.hot = hot
        #: The plans by (dtype, shape, op): the engine's hot path looks its signature up here first; the shared
        #: memory's one-phase allreduces too, once one ran (``steady_calls.SteadyCall``).
        self.plans: dict[tuple[np.dtype, tuple[int, ...], str], BoardAllreduce | SteadyCall] = {}
        peers = [(link.mailbox.position, link.mailbox.reader_views()[0])  # type: ignore[union-attr]
                 for link in group.other_links]
        self._spreader = Spreader(segment.header_words, segment.local.index(segment.me), peers)

    def plan_for(self, x: np.ndarray, op: str) -> BoardAllreduce | SteadyCall | None:
        """The plan for allreducing ``x`` (checked by the engine), or None if it does not fit a board (and no
        shared-memory call of it ran: ``steady_calls.SteadyCall``)."""
        key = (x.dtype, x.shape, op)
        plan = self.plans.get(key)
        if plan is None and BoardAllreduce.fits(self._segment, x):
            if len(self.plans) >= MAX_PLANS:
                self.plans.clear()
            plan = self.plans[key] = BoardAllreduce(self._segment, self._group, x, op, self._spreader, hot=self.hot)
        return plan

    def shared_plan(self, like: np.ndarray, op: str, phase: int, tail: bytes) -> BoardAllreduce:
        """A plan for a shared-memory allreduce's phase ``phase``, whose frames carry ``tail`` (the arrays are in
        the shared arenas: the caller passes them to each call as ``sources``)."""
        return BoardAllreduce(self._segment, self._group, like, op, self._spreader, phase, tail, hot=self.hot,
                              spread_every=SPREAD_SHARED)

    @property
    def spreader(self) -> Spreader:
        """This instance's ``placement.Spreader`` (the shm allreduce's general path uses it too)."""
        return self._spreader

    def close(self) -> None:
        """Drop the plans (their views of the boards must go before the mailboxes close)."""
        self.plans.clear()


class BoardAllreduce:
    """One signature (dtype, shape, op) of the world group's allreduce, with every view it needs made once."""

    #: The call, ``(seq, x, out=None, payload=None, sources=()) -> result or None``: ``one_peer_call``'s when
    #: the group has a single peer (two instances: a laptop's usual job, where a call's Python is most of its
    #: time), ``many_peers_call``'s otherwise. Seq ``n``: call ``n`` (published; None, nothing taken, if some
    #: peer's next frame is not this call's on its board within the spin: the general path receives). Seq 0: a
    #: hot call (``HotCalls``), which numbers itself and returns a result always (or raises).
    allreduce: Callable[..., np.ndarray]
    #: ``one_peer_call``'s end of a broadcast (``board_copies``): ``(x, its bytes, the peer's bytes, out) -> out``,
    #: in place of the reduction; None for an allreduce and an allgather.
    take_pair: Callable[[np.ndarray, memoryview, memoryview, np.ndarray], np.ndarray] | None = None
    #: Whether this plan is an allgather's (``board_copies.BoardAllgather``): ``one_peer_call`` then fills the two
    #: rows of ``out`` itself, from our bytes and the peer's (a method call for it was a twentieth of a 4 KiB call).
    gathers = False

    def __init__(self, segment: MailboxSegment, group: Group, like: np.ndarray, op: str,
                 spreader: Spreader, phase: int = Phase.FIRST, tail: bytes = b"",
                 template: HeaderTemplate | None = None, *, hot: HotCalls, spread_every: int = SPREAD_EVERY) -> None:
        # the header the general path would write for this signature (``Call.prefix``), each call's seq put in;
        # with ``tail`` (a fixed payload compared with the header) when the arrays travel elsewhere: shm's;
        # ``template``: another kind's header, whose ``reduce`` replaces the reduction (``board_copies``)
        copies = template is not None
        template = template or HeaderTemplate(ALLREDUCE, OP_CODES[op], phase, like.dtype.str, tuple(like.shape), -1,
                                              group.key, like.nbytes, tail)
        self._header = template.bytes
        hlen = template.size
        self._total = total = hlen + (0 if tail else like.nbytes)
        assert tail or self.fits(segment, like), "the engine asks first"
        self._ufunc = UFUNCS[op]
        #: The reduction (an allreduce's fallback reduces with it).
        self.op, self._hot = op, hot
        self._mean = len(group.members) if op == "mean" else 0
        #: Whether ``allreduce`` reduces inline: not for the mean (it divides) nor 0-d arrays (a ufunc of those
        #: makes a scalar), which take ``reduce``.
        self._inline = like.ndim > 0 and not self._mean and not copies
        self._spreader = spreader if spreader.oversubscribed else None  # (shm's too: measured, README)
        #: Every how many calls the spreader may move us (``SPREAD_EVERY``, or ``SPREAD_SHARED``).
        self._spread_every = spread_every
        self._crowded = spreader.oversubscribed
        #: How this plan waits for a peer's publication (see ``await_crowded`` and ``alone_waiter``); and
        #: ``Spreader.beside``, for a wait of its own (``board_copies.reader_call``).
        self._awaited: Await = await_crowded if self._crowded else alone_waiter(spreader.beside)
        self._beside, self._rank, self._links = spreader.beside, group.rank, group.other_links
        local = len(segment.local)
        self._segment = segment
        board, self._words = segment.board_views()
        # per parity: where the slot starts and where this signature's frame starts in it (any board: one layout)
        frames = [(at, board_frame_at(at, local, hlen)) for at in map(segment.board_slot_at, (0, 1))]
        # per parity: the slot's first word, the frame's offset, its header's and payload's bytes
        self._mine = [(at // 8, start - at, board[start:start + hlen], board[start + hlen:start + total])
                      for at, start in frames]
        # per peer (in ``group.others`` order): its mailbox and position among the host's instances, its sleeping
        # flag, its board's words, and per parity as above, with its payload as an array to reduce from
        # (a board is made only when every peer shares this host: each link has its mailbox)
        self._boxes = cast("tuple[Mailbox, ...]", tuple(link.mailbox for link in self._links))
        views = [box.reader_views() for box in self._boxes]
        self._positions = tuple(box.position for box in self._boxes)
        self._flags = tuple(v[0] for v in views)
        self._me = views[0][3]
        slots = [[(at // 8, start - at, peer_board[start:start + hlen],
                   None if tail else np.frombuffer(peer_board, like.dtype, like.size, start + hlen).reshape(like.shape))
                  for at, start in frames]
                 for _, peer_board, _, _ in views]
        self._waits = tuple(zip(self._links, self._boxes, (v[2] for v in views), slots))
        #: The ``out`` last checked for this plan by the engine and the array it was checked with: a call with
        #: these two again takes the engine's hot path.
        self.checked_out: np.ndarray | None = None
        self.checked_for: np.ndarray | None = None
        #: The last call's array and its bytes: a loop that allreduces one array reuses the view.
        self._x: np.ndarray | None = None
        self._x_bytes = memoryview(b"")
        # (typed as a hot call's: a call with its own seq returns None when a peer is late, and those callers check)
        self.allreduce = cast("Callable[..., np.ndarray]",
                              many_peers_call(self) if len(self._links) != 1 else one_peer_call(self))

    @staticmethod
    def fits(segment: MailboxSegment, like: np.ndarray) -> bool:
        """Whether an allreduce of ``like`` can take this path: not an empty array, not one too big for a board."""
        return 0 < like.nbytes <= segment.board_capacity - header_size(like.ndim)

    def bytes_of(self, x: np.ndarray) -> memoryview:
        """``x``'s bytes, kept with ``x`` for the next call: a loop that allreduces one array reuses the view."""
        self._x, self._x_bytes = x, x.data.cast("B")
        return self._x_bytes

    def _publication_views(self) -> tuple[list[tuple], tuple]:
        """For ``publisher``: per parity, our slot (where its length, offset and publication go, the frame's
        offset, its header's and payload's bytes, and per peer its link and where its index goes); per peer its
        sleeping flag and nudge."""
        links = self._links
        mine = [(first + LENGTH, first + OFFSET, first + PUBLICATION, offset, header_bytes, payload_bytes,
                 tuple(zip(links, [first + INDICES + position for position in self._positions])))
                for first, offset, header_bytes, payload_bytes in self._mine]
        return mine, tuple(zip(self._flags, [link.nudge for link in links]))

    def slots_to_take(self, as_bytes: bool = False) -> tuple[tuple, tuple]:
        """For a call with three members or more (``many_peers_call``, ``board_copies.many_peers_copy_call``), per
        peer in ``group.others`` order: its link, mailbox and board's words, and per parity where its
        publication and index for us are, its header, and its payload to read (an array, or its bytes if
        ``as_bytes``; None where the arrays travel elsewhere), and its header's words (for the wait); and per peer
        its link and mailbox."""
        me = self._me + INDICES
        waits = tuple((link, box, peer_words,
                       [(first + PUBLICATION, first + me, header_bytes,
                         array.data.cast("B") if as_bytes and array is not None else array)
                        for first, _, header_bytes, array in slots], peer)
                      for (link, box, peer_words, slots), peer in zip(self._waits, self._flags))
        return waits, tuple((link, box) for link, box, _, _, _ in waits)

    def _pair_slots(self) -> tuple[list[tuple], list[tuple]]:
        """For ``one_peer_call``, per parity, our slot: where its length, offset, index for the peer and
        publication go, the frame's offset, its header's and payload's bytes; the peer's: where its publication
        and index for us are, its header, its payload as an array and as bytes."""
        (_, _, _, slots), = self._waits
        mine = [(first + LENGTH, first + OFFSET, first + INDICES + self._positions[0], first + PUBLICATION, offset,
                 header_bytes, payload_bytes) for first, offset, header_bytes, payload_bytes in self._mine]
        theirs = [(first + PUBLICATION, first + self._me + INDICES, header_bytes, array,
                   None if array is None else array.data.cast("B")) for first, _, header_bytes, array in slots]
        return mine, theirs

    def reduce(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """The members' arrays reduced in member order (``calls.reduce_in_order``) into ``out`` or a new array,
        then the mean's division."""
        result = reduce_in_order(self._ufunc, arrays, out)
        if self._mean:
            np.divide(result, self._mean, out=result, casting="unsafe")
        return result


def publisher(plan: BoardAllreduce) -> Callable[[int, np.ndarray, memoryview | None], memoryview]:
    """The first half of a call with three members or more: ``publish(seq, x, payload)`` puts call ``seq``'s
    frame (``payload``, or ``x``'s bytes) on our board, numbered by each link, and nudges the peers asleep;
    it returns the payload. (One frame more a call than inline, a few hundredths of a 4 KiB call at N=4,
    for one copy of these lines where the plans' calls, ``many_peers_call`` and
    ``board_copies.many_peers_copy_call``, would have two.)"""
    header, segment, words, total, spreader = plan._header, plan._segment, plan._words, plan._total, plan._spreader
    mine, sleepers, spread_every = *plan._publication_views(), plan._spread_every

    def publish(seq: int, x: np.ndarray, payload: memoryview | None) -> memoryview:
        if spreader is not None and not seq % spread_every:
            spreader.spread()
        put_seq(header, SEQ_AT, seq)
        published = segment.publications = segment.publications + 1  # (``MailboxSegment.publish``, inline)
        length_at, offset_at, publication_at, offset, header_bytes, payload_bytes, indices = mine[published & 1]
        header_bytes[WHOLE] = header
        payload = payload if payload is not None else plan._x_bytes if x is plan._x else plan.bytes_of(x)
        payload_bytes[WHOLE] = payload
        words[length_at], words[offset_at] = total, offset
        for link, at in indices:  # (``claim_each``, inline)
            words[at] = index = link.sent
            link.sent = index + 1
        words[publication_at] = published  # publish: after the rest of the slot (x86-64 keeps stores in order)
        FENCE_ACQUIRE()  # ``full_fence``, inline: then the sleeping flags (see mailbox)
        FENCE_RELEASE()
        for flag, nudge in sleepers:
            if flag[SLEEPING]:
                nudge()
        return payload
    return publish


def many_peers_call(plan: BoardAllreduce) -> Callable[..., np.ndarray | None]:
    """The plan's call for three members or more (``BoardAllreduce.allreduce``): see the module docstring."""
    header, spreader, ufunc, inline, rank = plan._header, plan._spreader, plan._ufunc, plan._inline, plan._rank
    reduce, awaited, publish = plan.reduce, plan._awaited, publisher(plan)
    counter, spin, failed, fallback = plan._hot.counter, plan._hot.spin, plan._hot.failed, plan._hot.fallback
    waits, taken = plan.slots_to_take()

    def call(seq: int, x: np.ndarray, out: np.ndarray | None = None, payload: memoryview | None = None,
             sources: tuple[np.ndarray, ...] = ()) -> np.ndarray | None:
        if hot := not seq:
            seq = counter[0] = counter[0] + 1
        try:
            publish(seq, x, payload)
            arrays, result, waited = [], None, False  # (gathered as ``slots_to_take`` says)
            for link, box, peer_words, slots, peer in waits:  # (as the general path checks a frame: see the class)
                wanted = box.board_taken + 1
                publication_at, index_at, header_bytes, array = slots[wanted & 1]
                if peer_words[publication_at] != wanted:
                    waited = True
                    if not awaited(peer_words, publication_at, wanted, spin, peer):
                        break
                if peer_words[index_at] != link.received or header_bytes.tobytes() != header:
                    break  # (tobytes and a memcmp: a third of a memoryview comparison's cost)
                arrays.append(array)
            else:
                if inline and not sources:  # ``calls.reduce_in_order``, inline (the first ufunc call makes a result)
                    arrays.insert(rank, x)
                    result = ufunc(arrays[0], arrays[1]) if out is None else ufunc(arrays[0], arrays[1], out)
                    for other in arrays[2:]:
                        ufunc(result, other, result)
                else:  # (the same calls; ``sources``: the arrays are in shared memory, shm's)
                    result = reduce([*(sources or arrays)[:rank], x, *(sources or arrays)[rank:]], out)
                for link, box in taken:  # take (``took_published``, inline): their writers may reuse those slots
                    box.board_taken += 1
                    link.received += 1
                if spreader is not None and (not waited or sources):
                    os.sched_yield()  # a peer on our CPU may still have this call to finish (module docstring)
        except BaseException as exc:
            if hot:
                failed(exc)
            raise
        return result if result is not None or not hot else fallback(plan, x, out)
    return call


def one_peer_call(plan: BoardAllreduce) -> Callable[..., np.ndarray | None]:
    """``many_peers_call`` for two members, unrolled: the same frames, checks and order, all it reads bound once."""
    (link, box, peer_words, _), = plan._waits
    header, segment, words, total, spreader = plan._header, plan._segment, plan._words, plan._total, plan._spreader
    ufunc, inline, rank, reduce, awaited = plan._ufunc, plan._inline, plan._rank, plan.reduce, plan._awaited
    take_pair, hooks, nudge, flag, gather = plan.take_pair, plan._hot, link.nudge, plan._flags[0], plan.gathers
    counter, spin, failed, fallback = hooks.counter, hooks.spin, hooks.failed, hooks.fallback
    (mine, theirs), spread_every, other = plan._pair_slots(), plan._spread_every, 1 - plan._rank

    def call(seq: int, x: np.ndarray, out: np.ndarray | None = None, payload: memoryview | None = None,
             sources: tuple[np.ndarray, ...] = ()) -> np.ndarray | None:
        if hot := not seq:
            seq = counter[0] = counter[0] + 1
        try:
            if spreader is not None and not seq % spread_every:
                spreader.spread()
            put_seq(header, SEQ_AT, seq)
            published = segment.publications = segment.publications + 1
            length_at, offset_at, index_at, publication_at, offset, header_bytes, payload_bytes = mine[published & 1]
            header_bytes[WHOLE] = header
            if payload is None:
                payload = plan._x_bytes if x is plan._x else plan.bytes_of(x)
            payload_bytes[WHOLE] = payload
            words[length_at], words[offset_at] = total, offset
            words[index_at] = index = link.sent  # (``link.claim()`` and, below, ``link.took_published()``, inline:
            link.sent = index + 1  # each method call is a twentieth of a small call)
            words[publication_at] = published
            FENCE_ACQUIRE()
            FENCE_RELEASE()
            if flag[SLEEPING]:
                nudge()
            wanted = box.board_taken + 1
            publication_at, index_at, header_bytes, array, array_bytes = theirs[wanted & 1]
            if ((not (there := peer_words[publication_at] == wanted) and not awaited(peer_words, publication_at,
                                                                                     wanted, spin, flag))
                    or peer_words[index_at] != link.received or header_bytes.tobytes() != header):
                result = None
            else:
                if sources:
                    array = sources[0]  # (the slots hold no arrays then)
                if inline:
                    result = ufunc(x, array, out) if rank == 0 else ufunc(array, x, out)
                elif gather:  # (an allgather: both rows, in member order, by the byte views of ``out`` made once)
                    rows = plan._rows if out is plan._rows_for else plan._rows_of(out)  # type: ignore[attr-defined]
                    rows[rank][WHOLE], rows[other][WHOLE] = payload, array_bytes
                    result = out
                elif take_pair is not None:
                    result = take_pair(x, payload, array_bytes, out)  # type: ignore[arg-type]  # (a copy: out given)
                else:
                    result = reduce([x, array] if rank == 0 else [array, x], out)
                box.board_taken = wanted
                link.received += 1
                if spreader is not None and (there or sources):  # (when we published last: ``many_peers_call``'s)
                    os.sched_yield()
        except BaseException as exc:
            if hot:
                failed(exc)
            raise
        return result if result is not None or not hot else fallback(plan, x, out)
    return call
