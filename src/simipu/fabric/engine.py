"""The collectives: deterministic algorithms over the mesh of links that ``connect`` built.

Algorithms (flat, over the full mesh; every instance has a link to every other):

* small allreduce (up to ``SMALL_BYTES``, or ``SHARED_BYTES`` on one host):
  every member sends its whole array to every other member in one round, then
  each reduces all of them itself in index order, ``((x0 op x1) op x2) ...``.
  One round trip; every member runs the same NumPy operations in the same
  order, so all get the same bits.
* large allreduce, all members on this host: through shared memory (shm.py):
  each member reduces one chunk reading the others' segments directly.
* large allreduce otherwise: reduce-scatter then allgather over the sockets.
  The elements are cut into one chunk per member; member k receives chunk k
  from everyone, reduces it in index order, and sends the result to everyone.
  Each member sends and receives about 2(N-1)/N of the data, reduces 1/N.
* broadcast: the root sends to everyone (small, or two members), or scatters
  one chunk per other member, which those then allgather (large).
* allgather, reduce_scatter: one round, each member sends each other member
  what that member needs.
* barrier: an empty frame from every member to every other.

Whatever the algorithm, each chunk's reduction runs in member index order, so
results are bit-identical across runs and members whatever the timing. The
first phase of every collective sends one frame over every pair of members
(headers even when the payload is empty), so a mismatch is seen by every
member: if the signatures differ at all, each member differs from at least
one other, and each raises ``CollectiveMismatchError``. Hierarchical
reduction (within a host, then across host leaders) is the design goal for
many hosts; this flat version is correct and deterministic, and one round
trip for small arrays.

``timeout`` bounds only the clean-up after a mismatch (sending our remaining
headers so the peers see it too). Waiting for a live peer has no deadline: a
peer that computes for a minute before calling the collective is not an
error. A dead peer is: its socket hits EOF at once, and a lost host is
reported by the rendezvous within its heartbeat timeout; either raises
``PeerLostError`` naming the instance. After any such error the fabric is
unusable (the streams are out of step) and every later call raises.

Not thread-safe: one thread calls the collectives, in the same order on every
member of a group.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from .errors import FabricError, PeerLostError
from .membership import Membership
from .shm import SharedArena, allreduce_shared
from .transport import (ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, OP_CODES, REDUCE_SCATTER, Control, Link,
                        LossWatch, Receive, Send, Signature, encode_prefix, exchange)

#: Up to this many bytes, allreduce and broadcast over sockets use the one-round algorithms.
SMALL_BYTES = 256 * 1024
#: Above this many bytes, an allreduce among instances of one host goes through shared memory (shm.py).
SHARED_BYTES = 64 * 1024
#: How long a wait retries (yielding the CPU) before it sleeps in poll: see ``transport._spin``.
SPIN_SECONDS = 200e-6

_UFUNCS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
_EMPTY = memoryview(b"")


@dataclass(frozen=True)
class _Group:
    members: tuple[int, ...]
    rank: int  # this instance's position in members
    key: int
    links: tuple[Link | None, ...]  # by position; None for this instance

    def others(self) -> list[tuple[int, Link]]:
        return [(k, link) for k, link in enumerate(self.links) if link is not None]


class _Call(NamedTuple):
    """One collective as this instance called it: what every frame header says (a tuple: it is made per call)."""

    kind: int
    op: int
    dtype: str
    shape: tuple[int, ...]
    root: int
    seq: int
    group: _Group

    def signature(self, phase: int) -> Signature:
        return Signature(self.kind, self.op, phase, self.dtype, self.shape, self.root, self.seq, self.group.key)

    def prefix(self, phase: int) -> bytes:
        return encode_prefix(self.kind, self.op, phase, self.dtype, self.shape, self.root, self.seq, self.group.key)


def _bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (zero-size and 0-d included)."""
    return memoryview(array).cast("B") if array.size else _EMPTY


def _chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` ranges, sizes differing by at most one."""
    return [(count * k // parts, count * (k + 1) // parts) for k in range(parts)]


class Fabric:
    """One instance's end of the job's collectives (see the module docstring for the algorithms)."""

    def __init__(self, membership: Membership, links: dict[int, Link], control: Control | None, *,
                 timeout: float = 10.0, on_close: Callable[[], None] | None = None) -> None:
        self.membership = membership
        self.instance = membership.instance
        self.num_instances = membership.num_instances
        self.timeout = timeout
        self._links = links
        self._control = control
        self._watch = LossWatch(control)
        self._on_close = on_close
        self._groups: dict[tuple[int, ...], _Group] = {}
        self._seq: dict[tuple[int, ...], int] = {}
        self._scratch: dict[int, np.ndarray] = {}
        self._arena = SharedArena(f"poprun-{membership.job_id}-{self.instance}") if SharedArena.available() else None
        self._broken: FabricError | None = None
        self._closed = False

    # -- public collectives ------------------------------------------------------
    def allreduce(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None) -> np.ndarray:
        """Reduce ``array`` elementwise over the group; every member gets the same bits."""
        x = self._prepare(array, op)
        call = self._call(ALLREDUCE, x, group, op=op)
        g = call.group
        if len(g.members) == 1:
            result = x.copy()
        elif x.nbytes > SHARED_BYTES and self._arena is not None and all(link.local for _, link in g.others()):
            try:
                result = allreduce_shared(self._run, self._arena, call, g.members, g.rank, g.links, x, _UFUNCS[op],
                                          _chunks(x.size, len(g.members)))
            except FabricError as exc:
                self._broken = self._broken or exc
                raise
        elif x.nbytes <= SMALL_BYTES:
            result = self._allreduce_flat(call, x, op)
        else:
            result = self._allreduce_chunked(call, x, op)
        if op == "mean":
            np.divide(result, len(g.members), out=result, casting="unsafe")
        return result

    def broadcast(self, array: np.ndarray, root: int = 0, group: Sequence[int] | None = None) -> np.ndarray:
        """The root's array, on every member (the others pass an array of the same dtype and shape)."""
        x = self._prepare(array, None)
        if root not in self._group(group).members:
            raise ValueError(f"broadcast root {root} is not in the group {list(self._group(group).members)}")
        call = self._call(BROADCAST, x, group, root=root)
        g = call.group
        result = x.copy() if self.instance == root else np.empty_like(x)
        if len(g.members) == 1:
            return result
        root_rank = g.members.index(root)
        if x.nbytes <= SMALL_BYTES or len(g.members) == 2:
            payload = _bytes(x) if g.rank == root_rank else _EMPTY
            self._run(call, 1, {k: payload for k, _ in g.others()},
                      {k: _bytes(result) if k == root_rank else None for k, _ in g.others()})
            return result
        # scatter one chunk to each non-root member, then the non-roots allgather the chunks
        flat_in, flat_out = _bytes(x), _bytes(result)
        receivers = [k for k in range(len(g.members)) if k != root_rank]
        spans = dict(zip(receivers, (slice(*span) for span in _chunks(len(flat_out), len(receivers)))))
        if g.rank == root_rank:
            self._run(call, 1, {k: flat_in[spans[k]] for k in receivers}, {k: None for k in receivers})
            return result
        others = [k for k in receivers if k != g.rank]
        self._run(call, 1, {k: _EMPTY for k, _ in g.others()},
                  {k: flat_out[spans[g.rank]] if k == root_rank else None for k, _ in g.others()})
        self._run(call, 2, {k: flat_out[spans[g.rank]] for k in others}, {k: flat_out[spans[k]] for k in others})
        return result

    def allgather(self, array: np.ndarray, group: Sequence[int] | None = None) -> np.ndarray:
        """Every member's array, stacked in member order: shape ``(len(group), *array.shape)``."""
        x = self._prepare(array, None)
        call = self._call(ALLGATHER, x, group)
        g = call.group
        result = np.empty((len(g.members), *x.shape), dtype=x.dtype)
        result[g.rank] = x
        if len(g.members) > 1:
            self._run(call, 1, {k: _bytes(x) for k, _ in g.others()},
                      {k: _bytes(result[k]) for k, _ in g.others()})
        return result

    def reduce_scatter(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None) -> np.ndarray:
        """Split ``array`` into len(group) parts along axis 0, reduce each over the group; return this member's."""
        x = self._prepare(array, op)
        size = 0 if group is None else len(group)
        size = size or self.num_instances
        if x.ndim == 0 or x.shape[0] % size:
            raise ValueError(f"reduce_scatter needs axis 0 divisible by the group size {size}, "
                             f"got shape {x.shape}; pad the array or choose another group")
        call = self._call(REDUCE_SCATTER, x, group, op=op)
        g = call.group
        parts = x.reshape(len(g.members), x.shape[0] // len(g.members), *x.shape[1:])
        if len(g.members) == 1:
            result = parts[0].copy()
        else:
            mine = parts[g.rank]
            scratch = self._receive_into_scratch(call, 1, {k: _bytes(parts[k]) for k, _ in g.others()}, mine)
            result = self._reduce_in_order(op, g, mine, scratch)
        if op == "mean":
            np.divide(result, len(g.members), out=result, casting="unsafe")
        return result

    def barrier(self, group: Sequence[int] | None = None) -> None:
        """Return once every member of the group has entered the barrier."""
        call = self._call(BARRIER, None, group)
        if len(call.group.members) > 1:
            self._run(call, 1, {k: _EMPTY for k, _ in call.group.others()},
                      {k: None for k, _ in call.group.others()})

    def close(self) -> None:
        """Release the links and leave the rendezvous cleanly. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for link in self._links.values():
            link.close()
        self._links.clear()
        self._scratch.clear()
        if self._arena is not None:
            self._arena.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- algorithms ----------------------------------------------------------------
    def _allreduce_flat(self, call: _Call, x: np.ndarray, op: str) -> np.ndarray:
        g = call.group
        scratch = self._receive_into_scratch(call, 1, {k: _bytes(x) for k, _ in g.others()}, x)
        return self._reduce_in_order(op, g, x, scratch)

    def _allreduce_chunked(self, call: _Call, x: np.ndarray, op: str) -> np.ndarray:
        g = call.group
        flat = x.reshape(-1)
        spans = _chunks(flat.size, len(g.members))
        mine = flat[slice(*spans[g.rank])]
        scratch = self._receive_into_scratch(call, 1, {k: _bytes(flat[slice(*spans[k])]) for k, _ in g.others()},
                                             mine)
        result = np.empty_like(flat)
        reduced = result[slice(*spans[g.rank])]
        self._reduce_in_order(op, g, mine, scratch, out=reduced)
        self._run(call, 2, {k: _bytes(reduced) for k, _ in g.others()},
                  {k: _bytes(result[slice(*spans[k])]) for k, _ in g.others()})
        return result.reshape(x.shape)

    def _receive_into_scratch(self, call: _Call, phase: int, payloads: dict[int, memoryview],
                              like: np.ndarray) -> dict[int, np.ndarray]:
        """Send ``payloads`` and receive one ``like``-shaped array from every other member."""
        received = {k: self._scratch_array(k, like) for k, _ in call.group.others()}
        self._run(call, phase, payloads, {k: _bytes(a) for k, a in received.items()})
        return received

    def _scratch_array(self, rank: int, like: np.ndarray) -> np.ndarray:
        buffer = self._scratch.get(rank)
        if buffer is None or buffer.nbytes < like.nbytes:
            buffer = self._scratch[rank] = np.empty(max(like.nbytes, 64), dtype=np.uint8)
        return buffer[:like.nbytes].view(like.dtype).reshape(like.shape)

    @staticmethod
    def _reduce_in_order(op: str, g: _Group, mine: np.ndarray, received: dict[int, np.ndarray],
                         out: np.ndarray | None = None) -> np.ndarray:
        """((x0 op x1) op x2) ... in member order, whoever computes it, so every run gives the same bits."""
        ufunc = _UFUNCS[op]
        arrays = [mine if k == g.rank else received[k] for k in range(len(g.members))]
        out = np.empty_like(mine) if out is None else out
        ufunc(arrays[0], arrays[1], out=out)
        for other in arrays[2:]:
            ufunc(out, other, out=out)
        return out

    # -- plumbing ------------------------------------------------------------------
    def _run(self, call: _Call, phase: int, payloads: Mapping[int, memoryview],
             destinations: Mapping[int, memoryview | None], fds: Mapping[int, Sequence[int]] | None = None) -> None:
        """One phase: a frame to each rank in ``payloads``, one from each rank in ``destinations``."""
        prefix = call.prefix(phase)
        g = call.group
        sends = [Send(g.links[k], prefix + len(p).to_bytes(8, "little"), p, fds.get(k, ()) if fds else ())
                 for k, p in payloads.items()]
        receives = [Receive(g.links[k], prefix, 0 if d is None else len(d), d) for k, d in destinations.items()]
        try:
            exchange(sends, receives, self._watch, me=self.instance, members=g.members,
                     mine=lambda: call.signature(phase), flush_timeout=self.timeout, spin=SPIN_SECONDS)
        except PeerLostError as exc:
            self._broken = exc
            for link in self._links.values():
                link.send_abort(exc.instance, exc.reason)
            raise
        except BaseException as exc:  # a mismatch, or an interruption (Ctrl-C) that left the streams mid-frame
            self._broken = exc if isinstance(exc, FabricError) else FabricError(f"a collective was interrupted: {exc!r}")
            raise

    def _prepare(self, array: np.ndarray, op: str | None) -> np.ndarray:
        """A C-contiguous, native-byte-order view or copy of ``array``, checked for the op."""
        self._check_usable()
        x = np.asarray(array)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)  # (never for 0-d arrays, which it would make 1-d)
        if x.dtype.kind not in "biufc":
            raise TypeError(f"the fabric moves numeric arrays; got dtype {x.dtype}")
        if op is not None:
            if op not in _UFUNCS:
                raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(_UFUNCS)}")
            if x.dtype.kind == "b":
                raise TypeError(f"{op} of a bool array is ambiguous; convert it to an integer dtype first")
            if op == "mean" and x.dtype.kind in "iu":
                raise TypeError(f"mean of {x.dtype} arrays would need rounding; use op='sum' and divide, "
                                "or pass a floating-point array")
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        return x

    def _check_usable(self) -> None:
        if self._closed:
            raise FabricError("the fabric is closed")
        if self._broken is not None:
            raise FabricError(f"the fabric is unusable after an earlier error: {self._broken}") from self._broken

    def _call(self, kind: int, x: np.ndarray | None, group: Sequence[int] | None, *, op: str | None = None,
              root: int = -1) -> _Call:
        if x is None:
            self._check_usable()
        g = self._group(group)
        seq = self._seq[g.members] = self._seq[g.members] + 1
        return _Call(kind, OP_CODES[op] if op else 0, "" if x is None else x.dtype.str,
                     () if x is None else tuple(x.shape), root, seq, g)

    def _group(self, group: Sequence[int] | None) -> _Group:
        members = tuple(range(self.num_instances)) if group is None else tuple(int(i) for i in group)
        cached = self._groups.get(members)
        if cached is not None:
            return cached
        if list(members) != sorted(set(members)) or not members:
            raise ValueError(f"group {list(members)} must be sorted instance indices without repeats")
        if members[0] < 0 or members[-1] >= self.num_instances:
            raise ValueError(f"group {list(members)} names instances outside 0..{self.num_instances - 1}")
        if self.instance not in members:
            raise ValueError(f"instance {self.instance} called a collective on group {list(members)}, "
                             "which does not include it; only members may call it")
        key = int.from_bytes(hashlib.blake2b(repr(members).encode(), digest_size=8).digest(), "little")
        links = tuple(None if m == self.instance else self._links[m] for m in members)
        g = self._groups[members] = _Group(members, members.index(self.instance), key, links)
        self._seq[members] = 0
        return g
