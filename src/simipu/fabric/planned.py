"""The paths a call takes when a plan made by an earlier call fits it: the boards and the steady shared memory.

``Fabric`` (``engine.py``) checks a call and picks its algorithm; the calls
that come back with the same signature, call after call, are the ones a
training step makes, and for them a plan made once does the work with the
least Python: a small collective of the whole job on this host publishes on
the boards (``algorithms/board.py``, ``algorithms/board_copies.py``); a large
one whose shared-memory arena is already laid out for it publishes its one
phase there too (``_whole_on_board``, ``_copy_steady``). Each has its
fallback: when a peer's frame is not there within the spin, the general
exchange receives it (nothing is taken before), so the frames, the checks and
the bits are those of the general path.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, NamedTuple

import numpy as np

from .algorithms.board import MAX_PLANS, SPREAD_SHARED, BoardAllreduce, BoardAllreduces, HotCalls
from .algorithms.board_copies import BoardAllgather, BoardCopies, RootBroadcast
from .algorithms.calls import EMPTY, to_bytes
from .algorithms.phases import Phase
from .algorithms.shared import ANNOUNCEMENT_BYTES, SharedArena, ring_bytes, slots_for
from .algorithms.shared_copies import allgather_shared, broadcast_shared, current_views, refresh_views, steady_views
from .algorithms.shared_copies_board import SharedCopyPlan
from .algorithms.steady_calls import SteadyCall
from .errors import CollectiveMismatchError, FabricError
from .frames.header import ALLGATHER, ALLREDUCE, BROADCAST
from .frames.link import Link
from .frames.mailbox import MailboxSegment
from .frames.watch import Control
from .join.membership import Membership
from .runner import SPIN_SECONDS, PhaseRunner


class _WholePlan(NamedTuple):
    """``PlannedPaths._whole_on_board``'s plan for one signature, valid while its arena keeps this epoch and layout."""

    arena: SharedArena
    epoch: int
    layout: tuple[str, int, int]
    plan: BoardAllreduce
    mine: tuple[memoryview, ...]  # my slots' bytes (``shared.slots_for``)
    peers: tuple[tuple[np.ndarray, ...], ...]  # per slot, each peer's copy


class _CopyPlan(NamedTuple):
    """``PlannedPaths._copy_steady``'s plan for one signature, valid while its arena keeps this epoch and layout:
    what each call would otherwise look up and check again (with ``SharedCopyPlan.reduce``'s byte views, a sixth of
    a 256 KiB allgather at N=2)."""

    arena: SharedArena
    epoch: int
    layout: tuple[str, int, int]
    tail: bytes  # the steady announcement its frames carry
    plan: SharedCopyPlan
    mine: tuple[memoryview, ...]  # my slots' bytes; none where I copy nothing in (a broadcast's reader)
    sources: tuple[tuple[np.ndarray, ...], ...]  # per slot, each peer's copy in ``group.others`` order (root: none)


class PlannedPaths(PhaseRunner):
    """The plans an instance keeps for calls like earlier ones, and the paths that use them (see the module
    docstring); ``Fabric`` decides when."""

    def __init__(self, membership: Membership, links: dict[int, Link], control: Control | None, *,
                 timeout: float = 10.0, on_close: Callable[[str], None] | None = None,
                 mailboxes: MailboxSegment | None = None) -> None:
        super().__init__(membership, links, control, timeout=timeout, on_close=on_close, mailboxes=mailboxes)
        #: The world group's small allreduces on the boards (algorithms/board.py), when there are boards.
        self._boards = (None if self._board is None
                        else BoardAllreduces(self._board, self._group(None),
                                        HotCalls(self._world_seq, SPIN_SECONDS, self._broken_by, self._hot_fallback)))
        #: The world group's small broadcasts and allgathers on the boards (algorithms/board_copies.py).
        self._copies = None if self._boards is None else BoardCopies(self._boards)
        #: The plans a caller a frame above may call itself (``popdist.collectives``: one frame is a tenth of a
        #: small call), by the keys ``allreduce`` and ``broadcast``/``allgather`` look them up with: empty without
        #: boards, emptied when the fabric breaks or closes. A hot call, ``plan.allreduce(0, x, out)``, returns the
        #: result (``algorithms/board.py``'s ``HotCalls``) once its caller has checked what the engine's hot paths
        #: check: an ndarray, C-contiguous, the world group, and ``out`` None (an allreduce; a copy's is made) or
        #: the pair the plan was last checked with.
        self.hot_allreduces: dict = {} if self._boards is None else self._boards.plans
        self.hot_copies: dict = {} if self._copies is None else self._copies.plans
        #: ``_whole_on_board``'s plans by signature (see ``_WholePlan``).
        self._whole_plans: dict[tuple[np.dtype, tuple[int, ...], str], _WholePlan] = {}
        #: ``_copy_steady``'s plans by (root rank or -1, dtype, shape) (see ``_CopyPlan``).
        self._copy_plans: dict[tuple[int, np.dtype, tuple[int, ...]], _CopyPlan] = {}

    def _release_plans(self) -> None:
        self._whole_plans.clear()
        self._copy_plans.clear()
        if self._boards is not None:
            self._boards.close()
            self._copies.close()  # type: ignore[union-attr]  # (made with the boards)

    # -- the boards' paths --------------------------------------------------------------------------
    def _hot_fallback(self, plan: BoardAllreduce, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """A hot call (``HotCalls``) published, whose peers' frames were not all there within the spin: the
        general path receives them, for the call just numbered."""
        seq = self._world_seq[0]
        if type(plan) is RootBroadcast:
            return self._root_broadcast_fallback(plan, x, out, seq)  # type: ignore[arg-type]  # (made by the caller)
        if isinstance(plan, BoardAllgather):
            return self._copy_fallback_board(plan, x, out, seq)  # type: ignore[arg-type]  # (made by the caller)
        return self._board_fallback(plan, x, plan.op, seq, out)

    def _board_fallback(self, plan: BoardAllreduce, x: np.ndarray, op: str, seq: int,
                        out: np.ndarray | None = None) -> np.ndarray:
        """Call ``seq``, published on the board, whose peers' frames were not all there within the spin."""
        # the general path receives the peers' frames (nothing is taken yet), or raises why they cannot come;
        # without spinning again: the board's wait spun already, so a peer that is still late is slept on
        call = self._call(ALLREDUCE, x, None, op=op, seq=seq)
        g = call.group
        scratch, views = self.scratch_for(g, x)
        self._exchange(call, Phase.FIRST, [], list(zip(g.other_links, views)), spin=0.0)
        return plan.reduce([*scratch[:g.rank], x, *scratch[g.rank:]], out)

    def _whole_on_board(self, x: np.ndarray, op: str, out: np.ndarray | None = None) -> np.ndarray | None:
        """The world group's allreduce in shm's *whole* layout, its phase published and taken with a board plan:
        the frames and bits of ``allreduce_shared``, with a fraction of its Python, into ``out`` or a new array.
        None, having done nothing, unless the last call set the arena up for just this layout (then the general
        path runs)."""
        cached = self._whole_plans.get((x.dtype, x.shape, op))
        if cached is None or cached.arena.epoch != cached.epoch or cached.arena.layout != cached.layout:
            cached = self._whole_plan(x, op)  # (a first call, a remapped segment, or another layout in between)
            if cached is None:
                return None
        arena = cached.arena
        slot = arena.uses % len(cached.mine)
        arena.uses += 1
        cached.mine[slot][:] = to_bytes(x)
        counter = self._world_seq
        seq = counter[0] = counter[0] + 1
        plan = cached.plan
        try:
            result = plan.allreduce(seq, x, out, EMPTY, cached.peers[slot])
        except BaseException as exc:
            self._broken_by(exc)
            raise
        return result if result is not None else self._whole_fallback(plan, x, op, seq, slot, out)

    def _whole_plan(self, x: np.ndarray, op: str) -> _WholePlan | None:
        """``_whole_on_board``'s plan for ``x``'s signature, made for the arena as it is now; None unless the last
        call left the arena in this layout with every segment mapped both ways (the usual answer above 256 KiB,
        found cheaply)."""
        g = self._group(None)
        arena = self.arena_for(g)
        layout = ("whole", x.nbytes, x.itemsize)
        if arena.layout != layout or self._boards is None:
            return None
        steady = arena.steady_announcement([g.members[k] for k in g.others])
        if steady is None:  # (once it is not, it stays so until the arena remaps: a new epoch)
            return None
        n, slots = x.nbytes, slots_for(x.nbytes)
        spans = [slice(s * n, (s + 1) * n) for s in range(slots)]
        mine = tuple(to_bytes(arena.reserve(slots * n)[span]) for span in spans)
        peers = tuple(tuple(arena.peer(g.members[k], slots * n)[span].view(x.dtype).reshape(x.shape)
                            for k in g.others)
                      for span in spans)
        plan = self._boards.shared_plan(x, op, Phase.SHARED_READY, steady)
        if len(self._whole_plans) >= MAX_PLANS:
            self._whole_plans.clear()
        cached = self._whole_plans[(x.dtype, x.shape, op)] = _WholePlan(arena, arena.epoch, layout, plan, mine, peers)
        return cached

    def _whole_fallback(self, plan: BoardAllreduce, x: np.ndarray, op: str, seq: int, slot: int,
                        out: np.ndarray | None = None) -> np.ndarray:
        """``_whole_on_board``'s call ``seq``, published, whose peers' frames were not all there (or not as
        expected) within the spin: received and adopted as ``shm._announce`` does, then reduced."""
        call = self._call(ALLREDUCE, x, None, op=op, seq=seq)
        g, arena = call.group, self.arena_for(call.group)
        received = [bytearray(ANNOUNCEMENT_BYTES) for _ in g.others]
        self._exchange(call, Phase.SHARED_READY, [], [(link, memoryview(b)) for link, b in zip(g.other_links, received)],
                       spin=0.0)
        try:
            for link, payload in zip(g.other_links, received):
                arena.adopt(link, bytes(payload))
        except FabricError as exc:
            self.fail(exc)
            raise
        n = x.nbytes
        peers = [arena.peer(g.members[k], ring_bytes(n))[slot * n:(slot + 1) * n].view(x.dtype).reshape(x.shape)
                 for k in g.others]
        return plan.reduce([*peers[:g.rank], x, *peers[g.rank:]], out)

    def _settle(self, seq: int) -> None:
        """After a shared-memory allreduce, with more instances than CPUs: now and then let a crowded instance
        move (``algorithms/placement.py``), and yield once, so that a peer on our CPU finishes this call before
        we spin on its next one (as the board plans do)."""
        spreader = None if self._boards is None else self._boards.spreader
        if spreader is not None and spreader.oversubscribed:
            if not seq % SPREAD_SHARED:
                spreader.spread()
            os.sched_yield()

    def _copy_steady(self, x: np.ndarray, result: np.ndarray, root_rank: int) -> bool:
        """The world group's shared-memory broadcast from ``root_rank`` (-1: allgather) when it is like the last
        one, its SHARED_READY on the boards (algorithms/shared_copies_board.py); False, having done nothing,
        unless the last call set the arena up for just this one (then the general path runs)."""
        cached = self._copy_plans.get((root_rank, x.dtype, x.shape))
        if cached is None or cached.arena.layout != cached.layout or cached.arena.epoch != cached.epoch:
            cached = self._copy_plan(x, root_rank)  # (a first call, a remapped segment, or another layout between)
            if cached is None:
                return False
        arena = cached.arena
        slot = arena.uses % len(cached.sources)
        arena.uses += 1
        if cached.mine:
            cached.mine[slot][:] = to_bytes(x)
        counter = self._world_seq
        seq = counter[0] = counter[0] + 1
        plan = cached.plan
        try:
            done = plan.allreduce(seq, x, result, EMPTY, cached.sources[slot])
        except BaseException as exc:
            self._broken_by(exc)
            raise
        if done is None:
            self._copy_fallback(plan, x, result, root_rank, seq, slot)
        return True

    def _copy_plan(self, x: np.ndarray, root_rank: int) -> _CopyPlan | None:
        """``_copy_steady``'s plan for ``x``'s signature, made for the arena as it is now; None unless the last
        call left the arena in this layout with every segment mapped both ways (``steady_views``)."""
        g = self._group(None)
        if self._boards is None or len(g.members) < 2 or not g.one_host:
            return None
        arena, n = self.arena_for(g, "copy"), x.nbytes
        root = root_rank >= 0 and g.rank == root_rank
        layout = ("allgather", n, 0) if root_rank < 0 else ("broadcast", n, root_rank)
        writes = root_rank < 0 or root
        views = steady_views(arena, layout, ring_bytes(n) if writes else 0)
        if views is None:
            return None
        tail = views.payload
        assert tail is not None  # (``steady_views`` says so)
        key = (root_rank, x.dtype, x.shape)
        before = self._copy_plans.get(key)
        plan = before.plan if before is not None and before.tail == tail else SharedCopyPlan(self._boards, x,
                                                                                              root_rank, tail)
        mine = tuple(to_bytes(slot) for slot in views.mine) if writes else ()
        sources = tuple(() if root else tuple(peers[k] for k in g.others) for peers in views.peers)
        if len(self._copy_plans) >= MAX_PLANS:
            self._copy_plans.clear()
        cached = self._copy_plans[key] = _CopyPlan(arena, arena.epoch, layout, tail, plan, mine, sources)
        return cached

    def _steady_whole(self, x: np.ndarray, op: str,
                      general: Callable[[np.ndarray, str, None, np.ndarray | None], np.ndarray]) -> None:
        """A hot path's entry (``SteadyCall``) for the world group's one-phase shared-memory allreduce of ``x``'s
        signature (checked), kept with the board plans unless one is there: each call takes ``_whole_on_board``,
        or, where that does nothing, ``general(x, op, None, out)`` (the engine's general paths)."""
        plans = self._boards.plans  # type: ignore[union-attr]  # (the caller checked there are boards)
        key = (x.dtype, x.shape, op)
        if key in plans:
            return

        def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
            if self._broken is not None or self._closed:
                self._check_usable()
            shared = self._whole_on_board(x, op, out)
            return shared if shared is not None else general(x, op, None, out)

        if len(plans) >= MAX_PLANS:
            plans.clear()
        plans[key] = SteadyCall(run)

    def _steady_copy(self, x: np.ndarray, root_rank: int) -> SteadyCall:
        """A hot path's entry (``SteadyCall``) for the world group's shared-memory broadcast from ``root_rank``
        (-1: allgather) of ``x``'s signature, kept with the board plans: each call takes ``_copy_steady``, or
        else the general path (``shared_copies``)."""
        everyone = self._everyone

        def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
            assert out is not None, "the hot paths pass the result"
            if self._broken is not None or self._closed:
                self._check_usable()
            if self._copy_steady(x, out, root_rank):
                return out
            if root_rank < 0:
                self._copy_shared(allgather_shared, self._call(ALLGATHER, x, None), x, out)
            else:
                self._copy_shared(broadcast_shared, self._call(BROADCAST, x, None, root=everyone[root_rank]), x, out,
                                  root_rank)
            return out

        plans = self._copies.plans  # type: ignore[union-attr]  # (the caller checked there are boards)
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plan = plans[(root_rank, x.dtype, x.shape)] = SteadyCall(run)
        return plan

    def _copy_fallback(self, plan: SharedCopyPlan, x: np.ndarray, result: np.ndarray, root_rank: int, seq: int,
                       slot: int) -> None:
        """``_copy_steady``'s call ``seq``, published, whose peers' frames were not all there (or not as
        expected) within the spin: received and adopted as ``shared_copies`` does, then copied."""
        call = self._call(ALLGATHER if root_rank < 0 else BROADCAST, x, None, root=root_rank, seq=seq)
        g, arena = call.group, self.arena_for(call.group, "copy")
        received = [bytearray(ANNOUNCEMENT_BYTES) for _ in g.others]
        self._exchange(call, Phase.SHARED_READY, [], [(link, memoryview(b)) for link, b in zip(g.other_links, received)],
                       spin=0.0)
        root = g.rank == root_rank
        views = current_views(arena)
        try:
            for link, payload in zip(g.other_links, received):
                arena.adopt(link, bytes(payload))
            refresh_views(arena, views, call, 0 if root else ring_bytes(x.nbytes))
        except FabricError as exc:
            self.fail(exc)
            raise
        sources = [x] * len(g.others) if root else [views.peers[slot][k] for k in g.others]
        plan.reduce([*sources[:g.rank], x, *sources[g.rank:]], result)

    def _copy_fallback_board(self, plan: BoardAllgather, x: np.ndarray, out: np.ndarray, seq: int) -> np.ndarray:
        """A small broadcast or allgather on the boards (algorithms/board_copies.py: the allreduce's path, so its
        fallback too) whose peers' frames were not all there within the spin: the general path receives them (as
        ``_board_fallback``), numbered and headed as ours."""
        call = self._call(plan.kind, x, None, root=plan.root, seq=seq)
        g = call.group
        scratch, views = self.scratch_for(g, x)
        self._exchange(call, Phase.FIRST, [], list(zip(g.other_links, views)), spin=0.0)
        return plan.reduce([*scratch[:g.rank], x, *scratch[g.rank:]], out)

    def _root_broadcast_fallback(self, plan: RootBroadcast, x: np.ndarray, out: np.ndarray, seq: int) -> np.ndarray:
        """Call ``seq``, the world group's small broadcast among three members or more (algorithms/board_copies.py:
        the root's frame to each peer, nothing back), whose frames the mailboxes did not move at once: ``exchange``
        moves them (the root's to readers two calls behind, ``plan.unsent``; a non-root's after its wait past the
        spin, or a frame unlike the one expected), so the call finishes or raises as the general path does."""
        call = self._call(BROADCAST, x, None, root=plan.root, seq=seq)
        if plan.is_root:
            payload = x.data.cast("B")
            self._exchange(call, Phase.FIRST, [(link, payload, ()) for link in plan.unsent], [], spin=0.0)
        else:  # (we send the root nothing, so a root in a collective of messages cannot see us: we must)
            link: Link = plan.root_link  # type: ignore[assignment]  # (a non-root's)
            try:
                self._unanswered(call, link.peer)  # (its messages that came before this call)
            except CollectiveMismatchError as exc:
                self._broken_by(exc)
                raise
            link.divert = functools.partial(self._set_aside_unanswered, call)  # (and those that come now)
            try:
                self._exchange(call, Phase.FIRST, [], [(link, out.data.cast("B"))], spin=0.0)
            finally:
                link.divert = self._set_aside
        return out
