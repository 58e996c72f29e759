"""The collectives over the links alone: what runs when neither the board nor shared memory applies.

Each is a function of a ``protocol.Phases`` (``engine.Fabric``) and a
``calls.Call``, and moves its frames only through ``run``/``run_all`` (small
frames travel through the links' mailboxes, the rest over sockets):

* allreduce, small (up to ``SMALL_BYTES``): every member sends its whole
  array to every other in one round (FIRST), then each reduces all of them
  itself in member order, ``((x0 op x1) op x2) ...``;
* allreduce, large: reduce-scatter then allgather: member k receives chunk k
  from everyone (FIRST), reduces it in member order, and sends the result to
  everyone (SECOND);
* broadcast: the root sends to everyone, the others send each other empty
  frames (small, or two members), or it scatters one chunk per other member
  (FIRST), which those then allgather (SECOND); above ``SHARED_BYTES`` with
  every member on one host, ``shared_copies`` runs instead (so does
  allgather's);
* allgather, reduce_scatter: one round, each member sends each other member
  what that member needs; barrier: an empty frame between every two members.

Every first frame between two members goes both ways or from the member that
is not kept waiting, so a mismatched call is seen (engine's docstring).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .calls import EMPTY, UFUNCS, Call, Group, chunks, reduce_in_order, to_bytes
from .phases import Phase
from .protocol import Phases

#: Up to this many bytes, allreduce and broadcast use the one-round algorithms.
SMALL_BYTES = 256 * 1024


def in_order(g: Group, mine: np.ndarray, received: Mapping[int, np.ndarray]) -> list[np.ndarray]:
    """The members' arrays in member order: ours where our rank is, the received ones elsewhere."""
    return [mine if k == g.rank else received[k] for k in range(len(g.members))]


def allreduce_flat_or_chunked(phases: Phases, call: Call, x: np.ndarray, op: str) -> np.ndarray:
    """The one-round algorithm for small arrays, else reduce-scatter then allgather."""
    g, ufunc = call.group, UFUNCS[op]
    if x.nbytes <= SMALL_BYTES:  # the hot path of small collectives: see Fabric.scratch_for
        arrays, views = phases.scratch_for(g, x)
        phases.run_all(call, Phase.FIRST, to_bytes(x), views)
        return reduce_in_order(ufunc, [*arrays[:g.rank], x, *arrays[g.rank:]])
    flat = x.reshape(-1)
    spans = chunks(flat.size, len(g.members))
    mine = flat[slice(*spans[g.rank])]
    scratch = phases.receive_into_scratch(call, Phase.FIRST,
                                          {k: to_bytes(flat[slice(*spans[k])]) for k in g.others}, mine)
    result = np.empty_like(flat)
    reduced = result[slice(*spans[g.rank])]
    reduce_in_order(ufunc, in_order(g, mine, scratch), reduced)
    phases.run_all(call, Phase.SECOND, to_bytes(reduced), [to_bytes(result[slice(*spans[k])]) for k in g.others])
    return result.reshape(x.shape)


def broadcast(phases: Phases, call: Call, x: np.ndarray, result: np.ndarray, root_rank: int) -> None:
    """Fill ``result`` (the root's already holds its array) with the root's array, on a group of two or more."""
    g = call.group
    if x.nbytes <= SMALL_BYTES or len(g.members) == 2:  # one frame from the root, empty ones between the rest
        phases.run_all(call, Phase.FIRST, to_bytes(x) if g.rank == root_rank else EMPTY,
                       [to_bytes(result) if k == root_rank else None for k in g.others])
        return
    # scatter one chunk to each non-root member, then the non-roots allgather the chunks
    flat_in, flat_out = to_bytes(x), to_bytes(result)
    receivers = [k for k in range(len(g.members)) if k != root_rank]
    spans = dict(zip(receivers, (slice(*span) for span in chunks(len(flat_out), len(receivers)))))
    if g.rank == root_rank:
        phases.run(call, Phase.FIRST, {k: flat_in[spans[k]] for k in receivers}, {k: None for k in receivers})
        return
    others = [k for k in receivers if k != g.rank]
    phases.run(call, Phase.FIRST, {k: EMPTY for k in g.others},
               {k: flat_out[spans[g.rank]] if k == root_rank else None for k in g.others})
    phases.run(call, Phase.SECOND, {k: flat_out[spans[g.rank]] for k in others},
               {k: flat_out[spans[k]] for k in others})


def allgather(phases: Phases, call: Call, x: np.ndarray, result: np.ndarray) -> None:
    """Fill ``result`` (shape ``(members, *x.shape)``) with every member's array, in member order."""
    g = call.group
    result[g.rank] = x
    if len(g.members) > 1:
        phases.run_all(call, Phase.FIRST, to_bytes(x), [to_bytes(result[k]) for k in g.others])


def reduce_scatter(phases: Phases, call: Call, parts: np.ndarray, op: str) -> np.ndarray:
    """This member's part of ``parts`` (one per member along axis 0) reduced over the group, in member order."""
    g = call.group
    if len(g.members) == 1:
        return parts[0].copy()
    mine = parts[g.rank]
    scratch = phases.receive_into_scratch(call, Phase.FIRST, {k: to_bytes(parts[k]) for k in g.others}, mine)
    return reduce_in_order(UFUNCS[op], in_order(g, mine, scratch))


def barrier(phases: Phases, call: Call) -> None:
    """Return once every member of the group has sent its empty frame to every other."""
    if len(call.group.members) > 1:
        phases.run_all(call, Phase.FIRST, EMPTY, [None] * len(call.group.others))
