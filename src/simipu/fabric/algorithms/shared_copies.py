"""Broadcast and allgather among the instances of one host, through shared memory: copies, no sockets.

Above ``shared.SHARED_BYTES`` a frame goes over a Unix socket, which copies
it twice (into the kernel and out) per receiver and wakes the receiver once
per socket buffer; a root broadcasting 64 MiB to three peers on two cores
spent most of its time there (5x mpi4py's ``Bcast``). Here every member
copies into its own shared arena (``shared.SharedArena``: a memfd, mapped by
the peers) only what the others need, and each reads what it needs straight
from the others' arenas:

* broadcast: the root copies its array into its arena; SHARED_READY
  (``shared``'s announcement, all-to-all: it carries the mismatch check too);
  every other member copies the root's array out of the root's arena.
* allgather: each member copies its array into its arena; SHARED_READY;
  each copies every peer's array out of that peer's arena, in member order.

The arena's slots (``shared.slots_for``: two, or more for small arrays)
take turns, call by call, as in ``shared``'s *whole* layout: a slot is
written again two calls later at the earliest, after the next call's
SHARED_READY showed that every peer has left the call that read it. When the
layout changes (another kind, size or root) a SHARED_DRAIN phase first makes
every member wait until the others have left the previous call, since the
new slots may overlap the old. These arenas are not the allreduce's: each
keeps its own layout history (``Fabric.arena_for(g, "copy")``).

From ``cross_memory.CROSS_MEMORY_BYTES`` per array, where the copies run at
memory bandwidth, the peers read each other's arrays in place instead (one
copy: ``cross_memory``), when the group's members may. A call like the last
one (same layout, nothing remapped) reuses its views and announcement
(``_Views``): with more instances than cores, each one's Python is paid by
all of them. For the whole job, such a call's phase goes on the board
(``shared_copies_board``, through ``planned.PlannedPaths._copy_steady``), and
a call whose signature ran before skips the engine's checks of its arrays
(``steady_calls.SteadyCall``, found where the hot paths find the board plans).
"""

from __future__ import annotations

import weakref

import numpy as np

from .calls import EMPTY, Call
from .cross_memory import CrossMemory, allgather_cross, broadcast_cross
from .phases import Phase
from .protocol import Phases
from .shared import SharedArena, _announce, ring_bytes, slots_for


def broadcast_shared(phases: Phases, arena: SharedArena, cross: CrossMemory, call: Call, x: np.ndarray,
                     result: np.ndarray, root_rank: int) -> None:
    """Fill ``result`` with the root's array (the root's may be ``x`` itself); see the module docstring. (The
    root fills its own after the announcement, while the others copy theirs out.)"""
    g, n = call.group, x.nbytes
    if cross.wanted(phases, call, n):
        arena.layout = None  # (its first phase shows every peer has left every earlier call: no drain needed)
        broadcast_cross(phases, cross, call, x, result, root_rank)
        return
    root = g.rank == root_rank
    ring = ring_bytes(n)
    views, slot = _begin(phases, arena, call, ("broadcast", n, root_rank), ring if root else 0)
    if root:
        views.mine[slot][:] = x.reshape(-1).view(np.uint8)
        _ready(phases, arena, views, call, 0)  # (a segment to announce: the root maps the others', never reads)
        if result is not x:
            result[...] = x
        return
    _ready(phases, arena, views, call, ring)
    result.reshape(-1).view(np.uint8)[:] = views.peers[slot][root_rank]


def allgather_shared(phases: Phases, arena: SharedArena, cross: CrossMemory, call: Call, x: np.ndarray,
                     result: np.ndarray) -> None:
    """Fill ``result`` (shape ``(members, *x.shape)``) with every member's array in member order."""
    g, n = call.group, x.nbytes
    if cross.wanted(phases, call, n):
        arena.layout = None  # (as in broadcast_shared)
        allgather_cross(phases, cross, call, x, result)
        return
    ring = ring_bytes(n)
    views, slot = _begin(phases, arena, call, ("allgather", n, 0), ring)
    mine = x.reshape(-1).view(np.uint8)
    views.mine[slot][:] = mine
    _ready(phases, arena, views, call, ring)
    rows = result.reshape(len(g.members), -1).view(np.uint8)
    rows[g.rank] = mine
    for k, segment in views.peers[slot].items():
        rows[k] = segment


class _Views:
    """One arena's views for its current layout, kept while nothing is remapped (``SharedArena.epoch``): a
    call like the last one then costs its copies and one phase, little Python."""

    def __init__(self, arena: SharedArena, layout: tuple[str, int, int], mine_bytes: int) -> None:
        n, slots = layout[1], slots_for(layout[1])
        whole = arena.reserve(mine_bytes)
        self.layout, self.epoch, self.mine_bytes = layout, arena.epoch, mine_bytes
        #: My slots (``shared.slots_for``); all empty where I copy nothing in (a broadcast's reader).
        self.mine = tuple(whole[s * n:(s + 1) * n] for s in range(slots)) if mine_bytes else (whole,) * slots
        #: Each peer's slots, by rank (filled by ``_ready`` once their segments are mapped).
        self.peers: tuple[dict[int, np.ndarray], ...] = tuple({} for _ in range(slots))
        #: The steady announcement (None until one call ran the general one), and where the peers' arrive.
        self.payload: bytes | None = None
        self.received: list[memoryview] = []


_views: weakref.WeakKeyDictionary[SharedArena, _Views] = weakref.WeakKeyDictionary()


def _begin(phases: Phases, arena: SharedArena, call: Call, layout: tuple[str, int, int],
           mine_bytes: int) -> tuple[_Views, int]:
    """This call's views and the slot it writes (SHARED_DRAIN first if the layout changed: module docstring)."""
    slot = _next_slot(phases, arena, call, layout)
    views = _views.get(arena)
    if views is None or views.layout != layout or views.epoch != arena.epoch or views.mine_bytes != mine_bytes:
        views = _views[arena] = _Views(arena, layout, mine_bytes)
    return views, slot


def _ready(phases: Phases, arena: SharedArena, views: _Views, call: Call, peer_bytes: int) -> None:
    """Phase SHARED_READY (``shared._announce``): in the steady state one ``run_all`` of last time's bytes,
    the peers' adopted (a no-op unless one grew); else (a descriptor to send, a segment not yet mapped) the
    general announcement. Views are made again whenever a segment was (re)mapped."""
    g = call.group
    epoch = arena.epoch
    if views.payload is not None:
        phases.run_all(call, Phase.SHARED_READY, memoryview(views.payload), views.received)
        for k, b in zip(g.others, views.received):
            arena.adopt(g.links[k], b)  # type: ignore[arg-type]
        if epoch == arena.epoch:
            return
        segments = {k: arena.peer(g.members[k], peer_bytes) for k in g.others}
    else:
        segments = _announce(phases, arena, call, peer_bytes)
    _remake(views, arena, call, segments, peer_bytes)


def _remake(views: _Views, arena: SharedArena, call: Call, segments: dict[int, np.ndarray], peer_bytes: int) -> None:
    """The views again, after a general announcement or a (re)mapping."""
    g = call.group
    views.payload = arena.steady_announcement([g.members[k] for k in g.others])
    views.received = [memoryview(bytearray(len(views.payload or b""))) for _ in g.others]
    views.epoch = arena.epoch
    n = views.layout[1]
    for s, peers in enumerate(views.peers):
        peers.clear()
        peers.update({k: seg[s * n:(s + 1) * n] for k, seg in segments.items()} if peer_bytes else {})


def steady_views(arena: SharedArena, layout: tuple[str, int, int], mine_bytes: int) -> _Views | None:
    """For a call like the last one on ``arena`` (same layout, nothing remapped, the announcement steady): its
    views (valid while the arena keeps this layout and epoch); None otherwise."""
    views = _views.get(arena)
    if (arena.layout != layout or views is None or views.payload is None or views.layout != layout
            or views.epoch != arena.epoch or views.mine_bytes != mine_bytes):
        return None
    return views


def current_views(arena: SharedArena) -> _Views:
    """The views ``steady_views`` handed out for ``arena``."""
    return _views[arena]


def refresh_views(arena: SharedArena, views: _Views, call: Call, peer_bytes: int) -> None:
    """The peers' views made again if adopting their announcements (re)mapped a segment."""
    if views.epoch != arena.epoch:
        g = call.group
        _remake(views, arena, call, {k: arena.peer(g.members[k], peer_bytes) for k in g.others}, peer_bytes)


def _next_slot(phases: Phases, arena: SharedArena, call: Call, layout: tuple[str, int, int]) -> int:
    """The slot of the arena this call writes; SHARED_DRAIN first if the layout changed (module docstring)."""
    if arena.layout is not None and arena.layout != layout:
        phases.run_all(call, Phase.SHARED_DRAIN, EMPTY, [None] * len(call.group.others))
    arena.layout = layout
    slot = arena.uses % slots_for(layout[1])
    arena.uses += 1
    return slot
