"""Hierarchical allreduce: within each host first, then across one leader per host, then back within each host.

Used when a collective's members span several hosts and some host holds
several of them (see ``engine``). Only the hosts' leaders (each host's lowest
member) talk across hosts, so the data crossing between hosts does not grow
with the number of instances per host.

Phases (every frame carries the collective's own signature):

21   within each host, to its leader: each other member's array (small), or
     "my array is in my shared segment" (large: shm.py's segments, one per
     group, read in place); the leader reduces its host's arrays in index order;
1-2  among the leaders, over TCP: the hosts' partial results, reduced in
     leader order (engine's one-round or reduce-scatter/allgather algorithm);
23   within each host, from its leader: the result (small), or "it is in my
     segment" (large).

The segments are reused without a further phase: a member rewrites its own
in the next call's phase 21, after its leader read it (before phase 23); the
leader rewrites its own after the next call's phase 21, when every member of
the host has finished copying the result out.

Phase 21 compares each member's header with its leader's, phases 1-2 the
leaders' with each other: those pairs connect every member, so a mismatch
anywhere is seen somewhere and mismatch notices carry it to the rest.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from .calls import UFUNCS, Call, Group, reduce_in_order, to_bytes
from .shared import ANNOUNCEMENT_BYTES, SHARED_BYTES, SharedArena


class Fabric(Protocol):
    """What this algorithm needs of the engine (``engine.Fabric``, which calls it): phases, the flat
    algorithm among the leaders, and the shared segments. A protocol, so this module needs no engine."""

    def run(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
            destinations: Mapping[int, memoryview | None],
            fds: Mapping[int, Sequence[int]] | None = None) -> None: ...
    def receive_into_scratch(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
                             like: np.ndarray) -> dict[int, np.ndarray]: ...
    def allreduce_flat_or_chunked(self, call: Call, x: np.ndarray, op: str) -> np.ndarray: ...
    def arena_for(self, g: Group) -> SharedArena: ...


def allreduce_hierarchical(fabric: Fabric, call: Call, x: np.ndarray, op: str) -> np.ndarray:
    """``op``-reduce ``x`` over ``call``'s hierarchical group; see the module docstring."""
    g = call.group
    local = call.within(g.local)
    shared = x.nbytes > SHARED_BYTES and len(local.group.members) > 1 and SharedArena.available()
    arena = fabric.arena_for(local.group) if shared else None
    partial = _reduce_to_leader(fabric, local, x, UFUNCS[op], arena)
    total = None
    if g.leaders is not None:
        assert partial is not None
        total = fabric.allreduce_flat_or_chunked(call.within(g.leaders), partial, op)
    return _distribute(fabric, local, x, total, arena)


def _reduce_to_leader(fabric: Fabric, local: Call, x: np.ndarray, ufunc: Callable[..., np.ndarray],
                      arena: SharedArena | None) -> np.ndarray | None:
    """Phase 21: the host's arrays reduced in index order, on the leader (None on the others)."""
    lg = local.group
    others = lg.others
    if not others:
        return x
    if lg.rank != 0:
        if arena is None:
            fabric.run(local, 21, {0: to_bytes(x)}, {})
        else:
            arena.reserve(x.nbytes)[:] = to_bytes(x)
            payload, fds = arena.announcement(lg.members[0])
            fabric.run(local, 21, {0: payload}, {}, {0: fds})
        return None
    if arena is None:
        scratch = fabric.receive_into_scratch(local, 21, {}, x)
        return reduce_in_order(ufunc, [x, *(scratch[k] for k in others)])
    received = {k: bytearray(ANNOUNCEMENT_BYTES) for k in others}
    fabric.run(local, 21, {}, {k: memoryview(b) for k, b in received.items()})
    for k in others:
        arena.adopt(lg.links[k], received[k])  # type: ignore[arg-type]
    peers = [arena.peer(lg.members[k], x.nbytes).view(x.dtype).reshape(x.shape) for k in others]
    return reduce_in_order(ufunc, [x, *peers])


def _distribute(fabric: Fabric, local: Call, x: np.ndarray, total: np.ndarray | None,
                arena: SharedArena | None) -> np.ndarray:
    """Phase 23: the leader's result, on every member of its host."""
    lg = local.group
    others = lg.others
    if not others:
        assert total is not None
        return total
    if lg.rank == 0:
        assert total is not None
        if arena is None:
            fabric.run(local, 23, {k: to_bytes(total) for k in others}, {})
            return total
        arena.reserve(total.nbytes)[:] = to_bytes(total)
        announcements = {k: arena.announcement(lg.members[k]) for k in others}
        fabric.run(local, 23, {k: a[0] for k, a in announcements.items()}, {},
                   {k: a[1] for k, a in announcements.items()})
        return total
    result = np.empty_like(x)
    if arena is None:
        fabric.run(local, 23, {}, {0: to_bytes(result)})
        return result
    received = bytearray(ANNOUNCEMENT_BYTES)
    fabric.run(local, 23, {}, {0: memoryview(received)})
    arena.adopt(lg.links[0], received)  # type: ignore[arg-type]
    to_bytes(result)[:] = arena.peer(lg.members[0], x.nbytes).data
    return result
