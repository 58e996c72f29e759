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

The arena's two halves alternate, call by call, as in ``shared``'s *whole*
layout: a half is written again two calls later, after the next call's
SHARED_READY showed that every peer has left the call that read it. When the
layout changes (another kind, size or root) a SHARED_DRAIN phase first makes
every member wait until the others have left the previous call, since the
new halves may overlap the old. These arenas are not the allreduce's: each
keeps its own layout history (``Fabric.arena_for(g, "copy")``).
"""

from __future__ import annotations

import numpy as np

from .calls import EMPTY, Call
from .cross_memory import CrossMemory, allgather_cross, broadcast_cross
from .phases import Phase
from .protocol import Phases
from .shared import SharedArena, _announce


def broadcast_shared(phases: Phases, arena: SharedArena, cross: CrossMemory, call: Call, x: np.ndarray,
                     result: np.ndarray, root_rank: int) -> None:
    """Fill ``result`` with the root's array (the root's may be ``x`` itself); see the module docstring. (The
    root fills its own after the announcement, while the others copy theirs out.)"""
    g, n = call.group, x.nbytes
    if cross.wanted(phases, call, n):
        arena.layout = None  # (its first phase shows every peer has left every earlier call: no drain needed)
        broadcast_cross(phases, cross, call, x, result, root_rank)
        return
    half = _next_half(phases, arena, call, ("broadcast", n, root_rank))
    if g.rank == root_rank:
        arena.reserve(2 * n)[half * n:(half + 1) * n] = x.reshape(-1).view(np.uint8)
        _announce(phases, arena, call, 0)
        if result is not x:
            result[...] = x
        return
    arena.reserve(0)  # (a segment to announce: the root maps it, never reads it)
    peers = _announce(phases, arena, call, 2 * n)
    result.reshape(-1).view(np.uint8)[:] = peers[root_rank][half * n:(half + 1) * n]


def allgather_shared(phases: Phases, arena: SharedArena, cross: CrossMemory, call: Call, x: np.ndarray,
                     result: np.ndarray) -> None:
    """Fill ``result`` (shape ``(members, *x.shape)``) with every member's array in member order."""
    g, n = call.group, x.nbytes
    if cross.wanted(phases, call, n):
        arena.layout = None  # (as in broadcast_shared)
        allgather_cross(phases, cross, call, x, result)
        return
    half = _next_half(phases, arena, call, ("allgather", n, 0))
    mine = x.reshape(-1).view(np.uint8)
    arena.reserve(2 * n)[half * n:(half + 1) * n] = mine
    peers = _announce(phases, arena, call, 2 * n)
    rows = result.reshape(len(g.members), -1).view(np.uint8)
    rows[g.rank] = mine
    for k, segment in peers.items():
        rows[k] = segment[half * n:(half + 1) * n]


def _next_half(phases: Phases, arena: SharedArena, call: Call, layout: tuple[str, int, int]) -> int:
    """The half of the arena this call writes; SHARED_DRAIN first if the layout changed (module docstring)."""
    if arena.layout is not None and arena.layout != layout:
        phases.run_all(call, Phase.SHARED_DRAIN, EMPTY, [None] * len(call.group.others))
    arena.layout = layout
    half = arena.uses % 2
    arena.uses += 1
    return half
