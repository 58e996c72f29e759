"""Hierarchical allreduce: within each host first, then across one leader per host, then back within each host.

Used when a collective's members span several hosts and some host holds
several of them (see ``engine``, which passes itself as the ``protocol.Phases``).
Only the hosts' leaders (each host's lowest member) talk across hosts, so the
data crossing between hosts does not grow with the number of instances per host.

Phases (``phases.Phase``; every frame carries the collective's own signature):

TO_LEADER (21)    within each host, to its leader: each other member's array
                  (small), or "my array is in my shared segment" (large:
                  shared.py's segments, one per group, read in place); the
                  leader reduces its host's arrays in index order;
FIRST, SECOND     among the leaders, over TCP: the hosts' partial results,
                  reduced in leader order (sockets.py's one-round or
                  reduce-scatter/allgather algorithm);
FROM_LEADER (23)  within each host, from its leader: the result (small), or
                  "it is in my segment" (large).

The segments are reused without a further phase: a member rewrites its own
in the next call's TO_LEADER phase, after its leader read it (before
FROM_LEADER); the leader rewrites its own after the next call's TO_LEADER,
when every member of the host has finished copying the result out.

TO_LEADER compares each member's header with its leader's, FIRST and SECOND
the leaders' with each other: those pairs connect every member, so a mismatch
anywhere is seen somewhere and mismatch notices carry it to the rest.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .calls import UFUNCS, Call, Group, reduce_in_order, to_bytes
from .phases import Phase
from .protocol import Phases
from .shared import ANNOUNCEMENT_BYTES, SHARED_BYTES, SharedArena
from .sockets import allreduce_flat_or_chunked


def allreduce_hierarchical(phases: Phases, arena_for: Callable[[Group], SharedArena], call: Call, x: np.ndarray,
                           op: str) -> np.ndarray:
    """``op``-reduce ``x`` over ``call``'s hierarchical group (``arena_for``: this instance's shared segment for
    a group, made on first use); see the module docstring."""
    g = call.group
    local = call.within(g.local)
    shared = x.nbytes > SHARED_BYTES and len(local.group.members) > 1 and SharedArena.available()
    arena = arena_for(local.group) if shared else None
    partial = _reduce_to_leader(phases, local, x, UFUNCS[op], arena)
    total = None
    if g.leaders is not None:
        assert partial is not None
        total = allreduce_flat_or_chunked(phases, call.within(g.leaders), partial, op)
    return _distribute(phases, local, x, total, arena)


def _reduce_to_leader(phases: Phases, local: Call, x: np.ndarray, ufunc: Callable[..., np.ndarray],
                      arena: SharedArena | None) -> np.ndarray | None:
    """Phase TO_LEADER: the host's arrays reduced in index order, on the leader (None on the others)."""
    lg = local.group
    others = lg.others
    if not others:
        return x
    if lg.rank != 0:
        if arena is None:
            phases.run(local, Phase.TO_LEADER, {0: to_bytes(x)}, {})
        else:
            arena.reserve(x.nbytes)[:] = to_bytes(x)
            payload, fds = arena.announcement(lg.members[0])
            phases.run(local, Phase.TO_LEADER, {0: payload}, {}, {0: fds})
        return None
    if arena is None:
        scratch = phases.receive_into_scratch(local, Phase.TO_LEADER, {}, x)
        return reduce_in_order(ufunc, [x, *(scratch[k] for k in others)])
    received = {k: bytearray(ANNOUNCEMENT_BYTES) for k in others}
    phases.run(local, Phase.TO_LEADER, {}, {k: memoryview(b) for k, b in received.items()})
    for k in others:
        arena.adopt(lg.links[k], received[k])  # type: ignore[arg-type]
    peers = [arena.peer(lg.members[k], x.nbytes).view(x.dtype).reshape(x.shape) for k in others]
    return reduce_in_order(ufunc, [x, *peers])


def _distribute(phases: Phases, local: Call, x: np.ndarray, total: np.ndarray | None,
                arena: SharedArena | None) -> np.ndarray:
    """Phase FROM_LEADER: the leader's result, on every member of its host."""
    lg = local.group
    others = lg.others
    if not others:
        assert total is not None
        return total
    if lg.rank == 0:
        assert total is not None
        if arena is None:
            phases.run(local, Phase.FROM_LEADER, {k: to_bytes(total) for k in others}, {})
            return total
        arena.reserve(total.nbytes)[:] = to_bytes(total)
        announcements = {k: arena.announcement(lg.members[k]) for k in others}
        phases.run(local, Phase.FROM_LEADER, {k: a[0] for k, a in announcements.items()}, {},
                   {k: a[1] for k, a in announcements.items()})
        return total
    result = np.empty_like(x)
    if arena is None:
        phases.run(local, Phase.FROM_LEADER, {}, {0: to_bytes(result)})
        return result
    received = bytearray(ANNOUNCEMENT_BYTES)
    phases.run(local, Phase.FROM_LEADER, {}, {0: memoryview(received)})
    arena.adopt(lg.links[0], received)  # type: ignore[arg-type]
    to_bytes(result)[:] = arena.peer(lg.members[0], x.nbytes).data
    return result
