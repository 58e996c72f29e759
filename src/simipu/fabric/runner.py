"""Running one phase of a collective at a time: the part of ``engine.Fabric`` that the algorithms see.

``PhaseRunner`` holds one instance's links, its groups and their call
numbers, the receive buffers and the shared-memory arenas, and implements
``algorithms.protocol.Phases``: ``run`` and ``run_all`` move one phase's
frames (``frames/exchange.py``), and a phase that fails makes the fabric
unusable and tells the peers why (an abort or mismatch notice on every link
at a frame boundary). ``engine.Fabric`` adds the collectives on top: which
algorithm each call takes, and the boards' fast paths.
"""

from __future__ import annotations

import select
from collections import deque
from typing import Callable, Mapping, Sequence, TypeVar

import numpy as np

from .algorithms.calls import Call, Group, check_members, checked_array, make_group
from .algorithms.cross_memory import CrossMemory
from .algorithms.scratch import ScratchBuffers
from .algorithms.shared import SharedArena
from .errors import CollectiveMismatchError, FabricError, PeerLostError
from .frames.exchange import exchange, exchange_all
from .frames.header import (
    BROADCAST,
    MESSAGE,
    OP_CODES,
    Signature,
    abort_notice,
    decode_prefix,
    mismatch_notice,
    unread_at_close,
)
from .frames.link import Link, LinkClosed
from .frames.mailbox import MailboxSegment, full_fence
from .frames.messages import NOTHING_WAITS, Kept, Source, raise_notice_ahead, take_message
from .frames.watch import READ_EVENTS, Control, LossWatch
from .join.membership import Membership

T = TypeVar("T")
R = TypeVar("R", bound="PhaseRunner")

#: How long a wait retries (yielding the CPU) before it sleeps in poll: see ``exchange._spin``.
SPIN_SECONDS = 200e-6
#: A clean close that waits for peers to take a small broadcast of ours looks again after this long at first,
#: then twice as long each time, up to the second (seconds): see ``PhaseRunner._unread_collective``.
CLOSE_LOOKS = (0.001, 0.05)


def _is_message(theirs: Signature) -> bool:
    return theirs.kind == MESSAGE


class PhaseRunner:
    """One instance's links, groups and call numbers, and the running of one phase at a time over them."""

    def __init__(self, membership: Membership, links: dict[int, Link], control: Control | None, *,
                 timeout: float = 10.0, on_close: Callable[[str], None] | None = None,
                 mailboxes: MailboxSegment | None = None) -> None:
        self.membership = membership
        self.instance = membership.instance
        self.num_instances = membership.num_instances
        self.timeout = timeout
        self._links = links
        self._control = control
        self._watch = LossWatch(control)
        self._on_close = on_close
        self._mailboxes = mailboxes
        #: Frames to every peer go to our board once, when every instance is on this host (see ``frames.mailbox``).
        self._board = mailboxes if mailboxes is not None and len(mailboxes.local) == self.num_instances else None
        self._groups: dict[tuple[int, ...], Group] = {}
        self._everyone = tuple(range(self.num_instances))
        #: Each group's call counter (a one-item list, so that the hot path holds the world group's own).
        self._seq: dict[tuple[int, ...], list[int]] = {}
        self._world_seq = self._seq.setdefault(self._everyone, [0])
        #: Point-to-point messages numbered per (source, destination) (``engine.Fabric.send``).
        self._messages: dict[tuple[int, int], int] = {}
        #: Per peer, its messages taken before a ``recv`` asked: while a send of ours waited for room, by
        #: ``message_waiting``, or set aside by a collective (``frames.messages``, ``Link.divert``).
        self._kept: dict[int, Kept] = {}
        #: Per peer, its link as a wait for messages sees it (``engine.Fabric._source``), made once.
        self._sources: dict[int, Source] = {}
        #: Per peer, the group of the two of us, which its messages are numbered in (``engine.Fabric._pair``).
        self._pairs: dict[int, Group] = {}
        self._scratch = ScratchBuffers()
        #: The small allreduce's receive buffers (``Phases.scratch_for``): looked up once per call.
        self.scratch_for = self._scratch.for_group
        self._arenas: dict[tuple[str, int, tuple[int, ...]], SharedArena] = {}
        #: Per group: may its members read each other's memory (``algorithms/cross_memory.py``)?
        self._cross: dict[tuple[int, tuple[int, ...]], CrossMemory] = {}
        self._broken: BaseException | None = None
        self._closed = False
        for link in links.values():
            link.divert = self._set_aside

    def _set_aside(self, link: Link) -> bool:
        """``Link.divert``: a subclass's (``engine.Fabric``) sets the peer's message at the head of ``link`` aside
        for a later ``recv``; here there are no messages."""
        return False

    def _set_aside_unanswered(self, call: Call, link: Link) -> bool:
        """``Link.divert`` while ``call`` waits for the frame of ``link``'s peer and sends that peer nothing: as
        ``_set_aside``; a subclass's (``engine.Fabric``) also raises the mismatch if the message is a part of the
        peer's own collective (``_unanswered``)."""
        return self._set_aside(link)

    def _unanswered(self, call: Call, peer: int) -> None:
        """Before ``call`` waits for ``peer``'s frame, sending it nothing: a subclass's (``engine.Fabric``) raises
        the mismatch if the peer's messages to us not received yet are a part of its own collective."""

    def transports(self) -> dict[int, str]:
        """How each peer is reached: "tcp", "unix", or "unix+mailbox" (shared-memory mailboxes beside it)."""
        return {peer: ("unix" if link.local else "tcp") + ("+mailbox" if link.mailbox is not None else "")
                for peer, link in sorted(self._links.items())}

    def close(self, why: str = "closed") -> None:
        """Leave the rendezvous cleanly, telling the others ``why`` (a ``join.messages.LEAVE_REASONS`` code),
        then release the links: a peer that sees them close hears why first. Idempotent."""
        if self._closed:
            return
        try:
            unread: BaseException | None = self._unread_collective()
        except BaseException as exc:  # (interrupted while it waited for readers: close all the same)
            unread = exc
        self._closed = True
        if self._on_close is not None:
            self._on_close(why)
        for link in self._links.values():
            link.divert = None
            link.close()
        self._links.clear()
        self._scratch.clear()
        self._release_plans()  # (their views of the boards and arenas go before those)
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()
        if self._mailboxes is not None:
            self._mailboxes.close()
        if unread is not None:
            raise unread

    def _unread_collective(self) -> Exception | None:
        """Before a clean close: the error for a collective's frame (or a mismatch notice) a peer left unread in
        our mailbox, for a call we made too: the calls differed where nobody compared them (a small broadcast's
        root writes and returns: ``algorithms/board_copies.py``), and a program must not end as if they had
        not. A full fence first: of two roots that wrote to each other and then close, one sees the other's.
        While a peer has not taken from our mailbox a broadcast's frame of ours (its root: the small broadcast
        among three or more, which nobody answers), we wait until it takes it, ends, or says why it cannot (its
        mismatch notice: our frame met another collective there, such as mpi4py's all-to-all, whose blocks it
        sent us as messages; those are dropped meanwhile, to reach what follows them), looking again
        ``CLOSE_LOOKS`` apart: a reader that takes our frame wakes nobody (the broadcast's hot path pays for
        nothing more). Two instances do not wait so for each other: the one that made as many calls or more
        finds the other's frame, of a call it made too, unread (the error above)."""
        if self._broken is not None or self._mailboxes is None:
            return None
        made = {g.key: self._seq[members][0] for members, g in self._groups.items()}
        waiting = [link for _, link in sorted(self._links.items()) if self._broadcast_untaken(link)]
        pause = CLOSE_LOOKS[0]
        while True:
            full_fence()
            for peer, link in sorted(self._links.items()):
                frame = link.mailbox.peek(link.received) if link.mailbox is not None else None
                error = unread_at_close(self.instance, peer, frame, made) if frame else None
                if error is not None:
                    return error
            if not waiting:
                return None
            try:
                waiting = self._still_untaken(waiting)
            except CollectiveMismatchError as notice:
                return notice
            if waiting:
                self._pause_at_close(waiting, pause)
                pause = min(2 * pause, CLOSE_LOOKS[1])

    def _broadcast_untaken(self, link: Link) -> bool:
        """Whether ``link``'s peer has not taken from our mailbox a broadcast's frame of ours as its root."""
        for frame in link.mailbox.untaken() if link.mailbox is not None else ():
            theirs, _ = decode_prefix(frame)
            if theirs.kind == BROADCAST and theirs.root == self.instance:
                return True
        return False

    def _still_untaken(self, links: list[Link]) -> list[Link]:
        """Those of ``links`` whose peer has not taken our broadcast, and may still: not ended, lost, or unable to
        tell us more (``_drop_messages``); raises what its mismatch notice says."""
        try:
            self._watch.check([link.peer for link in links])
        except PeerLostError as lost:
            links = [] if lost.instance < 0 else [link for link in links if link.peer != lost.instance]
        still = []
        for link in links:
            try:
                if self._drop_messages(link) and self._broadcast_untaken(link):
                    still.append(link)
            except (LinkClosed, PeerLostError):  # (ended; or an abort notice: a loss told late is not ours)
                continue
        return still

    def _drop_messages(self, link: Link) -> bool:
        """Take the messages ``link``'s peer has sent us, and drop them: the program has ended, nobody will receive
        them, and the peer may wait for room for more, or have its mismatch notice behind them (raised here).
        Whether the link may still tell us more (False: a frame that is not a message fills its stage)."""
        dropped: Kept = deque()
        while (other := take_message(link, _is_message, dropped, NOTHING_WAITS)) is None:
            dropped.clear()
        if other:  # (a collective's frame first: a notice may follow it)
            raise_notice_ahead(link)
        return bool(link.start or link.end < len(link.stage))

    def _pause_at_close(self, links: list[Link], seconds: float) -> None:
        """Sleep until one of ``links`` brings bytes (a notice, its end), a loss is told, or ``seconds`` pass."""
        poller = select.poll()  # not select(): an fd may be above FD_SETSIZE (1024)
        for link in links:
            poller.register(link.fd, READ_EVENTS)
        if self._watch.fd is not None:
            poller.register(self._watch.fd, select.POLLIN)
        poller.poll(seconds * 1000)

    def _release_plans(self) -> None:
        """Drop what a subclass made over the boards and arenas: when the fabric closes (``close`` closes those
        next) or breaks (so that the hot paths, which look a plan up and check nothing else, find none and take
        the checked path, which raises)."""

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the phases (``algorithms.protocol.Phases``) the algorithms run over -----------------------
    def receive_into_scratch(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
                             like: np.ndarray) -> dict[int, np.ndarray]:
        """Send ``payloads`` (a frame per rank) and receive one ``like``-shaped array from every other member.
        (One payload to every member is ``run_all`` with ``scratch_for``: the small collectives' hot path.)"""
        ranks = call.group.others
        scratch = [self._scratch.for_rank(k, like) for k in ranks]
        self.run(call, phase, payloads, {k: view for k, (_, view) in zip(ranks, scratch)})
        return {k: array for k, (array, _) in zip(ranks, scratch)}

    def run(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
            destinations: Mapping[int, memoryview | None], fds: Mapping[int, Sequence[int]] | None = None) -> None:
        """One phase: a frame to each rank in ``payloads``, one from each rank in ``destinations``."""
        links: Sequence[Link] = call.group.links  # type: ignore[assignment]  # (by other ranks: never our None)
        self._exchange(call, phase, [(links[k], p, fds.get(k, ()) if fds else ()) for k, p in payloads.items()],
                       [(links[k], d) for k, d in destinations.items()])

    def run_all(self, call: Call, phase: int, payload: memoryview, destinations: Sequence[memoryview | None]) -> None:
        """One phase where this member sends ``payload`` to every other and receives a frame from each
        (``destinations`` in the order of ``call.group.others``): the common case, made cheap."""
        try:
            exchange_all(call.prefix(phase), payload, call.group.other_links, destinations, self._watch,
                         me=self.instance, members=call.scope, mine=lambda: call.signature(phase),
                         flush_timeout=self.timeout, spin=SPIN_SECONDS, sleeper=self._mailboxes,
                         board=self._board if call.group.members == self._everyone else None)
        except BaseException as exc:
            self._broken_by(exc)
            raise

    def _exchange(self, call: Call, phase: int, sends: list[tuple[Link, memoryview, Sequence[int]]],
                  receives: list[tuple[Link, memoryview | None]], spin: float = SPIN_SECONDS) -> None:
        try:
            exchange(call.prefix(phase), sends, receives, self._watch, me=self.instance, members=call.scope,
                     mine=lambda: call.signature(phase), flush_timeout=self.timeout, spin=spin,
                     sleeper=self._mailboxes)
        except BaseException as exc:
            self._broken_by(exc)
            raise

    def _broken_by(self, exc: BaseException) -> None:
        """A phase failed: the fabric is unusable from now on, and peers that can still be told are told why."""
        if isinstance(exc, PeerLostError):
            self._break(exc, abort_notice(exc))
        elif isinstance(exc, CollectiveMismatchError):
            self._break(exc, mismatch_notice(exc))
        else:  # an interruption (Ctrl-C) or a corrupt stream: the streams are mid-frame
            self._broken = exc if isinstance(exc, FabricError) else FabricError(f"a collective was interrupted: {exc!r}")
            self._release_plans()

    def arena_for(self, g: Group, use: str = "reduce") -> SharedArena:
        """This instance's shared segment for the group (a subgroup of a hierarchical one has its own), one
        per ``use``: the allreduce's and broadcast/allgather's (``algorithms/shared_copies.py``) each keep
        their layout history."""
        key = (use, g.key, g.members)
        arena = self._arenas.get(key)
        if arena is None:
            label = f"poprun-{self.membership.job_id}-{self.instance}-arena{len(self._arenas)}"
            arena = self._arenas[key] = SharedArena(label)
        return arena

    def _copy_shared(self, algorithm: Callable[..., T], call: Call, *args: object) -> T:
        """Broadcast or allgather through shared memory (``algorithms/shared_copies.py``, or reading the peers'
        arrays in place: ``algorithms/cross_memory.py``), marking the fabric broken if it fails."""
        g = call.group
        cross = self._cross.get((g.key, g.members))
        if cross is None:
            cross = self._cross[(g.key, g.members)] = CrossMemory()
        try:
            return algorithm(self, self.arena_for(g, "copy"), cross, call, *args)
        except FabricError as exc:  # (run marked the fabric already; shared-memory checks did not)
            self.fail(exc)
            raise

    def fail(self, exc: FabricError) -> None:
        """A collective broke outside ``run`` (shared memory): the fabric is unusable from now on."""
        self._broken = self._broken or exc
        self._release_plans()

    # -- plumbing ------------------------------------------------------------------
    def _break(self, exc: FabricError, notice: bytes) -> None:
        """Mark the fabric unusable and tell every peer whose stream is at a frame boundary why."""
        self._broken = exc
        self._release_plans()
        for link in self._links.values():
            link.send_notice(notice)

    def _prepare(self, array: np.ndarray, op: str | None) -> np.ndarray:
        """``array`` checked for the op and made C-contiguous and native (``calls.checked_array``)."""
        self._check_usable()
        return checked_array(array, op)

    def _check_usable(self) -> None:
        if self._closed:
            raise FabricError("the fabric is closed")
        if self._broken is not None:
            raise FabricError(f"the fabric is unusable after an earlier error: {self._broken}") from self._broken

    def _call(self, kind: int, x: np.ndarray | None, group: Sequence[int] | None, *, op: str | None = None,
              root: int = -1, seq: int = 0) -> Call:
        """The next call on the group (``seq``: one numbered already)."""
        if x is None:
            self._check_usable()
        g = self._group(group)
        if not seq:
            counter = self._seq[g.members]
            seq = counter[0] = counter[0] + 1
        return Call(kind, OP_CODES[op] if op else 0, "" if x is None else x.dtype.str,
                    () if x is None else tuple(x.shape), root, seq, g, g.members)

    def _group(self, group: Sequence[int] | None) -> Group:
        members = self._everyone if group is None else tuple(int(i) for i in group)
        cached = self._groups.get(members)
        if cached is not None:
            return cached
        check_members(members, self.instance, self.num_instances)
        g = self._groups[members] = make_group(self.membership, self._links, members)
        self._seq.setdefault(members, [0])
        return g
