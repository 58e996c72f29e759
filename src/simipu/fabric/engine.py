"""The collectives: deterministic algorithms over the mesh of links that ``connect`` built.

Every instance has a link to every other; within a host, small frames travel
through shared-memory mailboxes and the rest over Unix sockets; between
hosts, TCP (``frames.link``). The engine checks each call, numbers it on its
group and picks an algorithm (``algorithms/``, their phases named in
``algorithms.phases``), each a function of the engine as ``algorithms.protocol.Phases``:

* the small allreduce, broadcast, allgather of the whole job on one host: the boards (algorithms/board*.py);
* a large allreduce (above ``SHARED_BYTES``), all members on one host: through
  shared memory (algorithms/shared.py): each member reduces one chunk reading
  the others' segments directly;
* an allreduce whose members span several hosts, some holding several of them:
  hierarchical (algorithms/hierarchical.py): each host reduces to its leader,
  the leaders allreduce among themselves over TCP, each leader hands the result
  to its host;
* everything else, over the links alone (algorithms/sockets.py): the one-round
  allreduce (up to ``SMALL_BYTES``) or reduce-scatter then allgather; the
  broadcast, the allgather, the reduce_scatter and the barrier.

Determinism: each reduction runs in a fixed order, so results are
bit-identical across runs and members whatever the timing. Flat: by member
index. Hierarchical: within each host by index, then across hosts in the
order of their lowest index, e.g. ``(a0 + a1) + (b0 + b1)`` where the flat
order is ``((a0 + b0) + a1) + b1``; so a different layout (other hosts,
another placement) may change floating-point results in the last bits, but
one layout always gives the same bits.

Mismatches: every algorithm's first frame between two members goes both ways
or from the member that is not kept waiting, and the pairs that compare
headers connect every member (all pairs when flat; each host's members with
its leader, and the leaders, when hierarchical). So if the members' calls
differ at all, some member sees a header unlike its own; it raises
``CollectiveMismatchError`` and sends a mismatch notice on each of its links,
and each member that receives one raises too and passes it on.

``timeout`` bounds only the clean-up after a mismatch (sending our remaining
headers so the peers see it too). Waiting for a live peer has no deadline: a
peer that computes for a minute before calling the collective is not an
error. A dead peer is: its socket hits EOF at once, and a lost host is
reported by the rendezvous within its heartbeat timeout; either raises
``PeerLostError`` naming the instance, and the loss is passed on as a notice.
After any such error the fabric is unusable and every later call raises.

Not thread-safe: one thread calls the collectives, in the same order on every
member of a group.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, TypeVar

import numpy as np

from .algorithms import sockets
from .algorithms.board import BoardAllreduce, BoardAllreduces
from .algorithms.board_copies import BoardAllgather, BoardCopies
from .algorithms.calls import UFUNCS, Call, Group, make_group, to_bytes
from .algorithms.hierarchical import allreduce_hierarchical
from .algorithms.outputs import result_for
from .algorithms.phases import Phase
from .algorithms.shared import SHARED_BYTES, SharedArena, allreduce_shared
from .algorithms.shared_copies import allgather_shared, broadcast_shared
from .errors import CollectiveMismatchError, FabricError, PeerLostError
from .frames.exchange import exchange, exchange_all
from .frames.header import (
    ALLGATHER,
    ALLREDUCE,
    BARRIER,
    BROADCAST,
    OP_CODES,
    REDUCE_SCATTER,
    abort_notice,
    mismatch_notice,
)
from .frames.link import Link
from .frames.mailbox import MailboxSegment
from .frames.watch import Control, LossWatch
from .join.membership import Membership

T = TypeVar("T")

#: How long a wait retries (yielding the CPU) before it sleeps in poll: see ``exchange._spin``.
SPIN_SECONDS = 200e-6


class Fabric:
    """One instance's end of the job's collectives (see the module docstring for the algorithms)."""

    def __init__(self, membership: Membership, links: dict[int, Link], control: Control | None, *,
                 timeout: float = 10.0, on_close: Callable[[], None] | None = None,
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
        self._seq: dict[tuple[int, ...], int] = {}
        #: The world group's small allreduces on the boards (algorithms/board.py), when there are boards.
        self._boards = None if self._board is None else BoardAllreduces(self._board, self._group(None))
        self._copies = None if self._boards is None else BoardCopies(self._boards)
        self._scratch: dict[int, np.ndarray] = {}
        self._scratch_views: dict[tuple[int, np.dtype, tuple[int, ...]], tuple[np.ndarray, memoryview]] = {}
        self._scratch_sets: dict[tuple[tuple[int, ...], np.dtype, tuple[int, ...]],
                                 tuple[list[np.ndarray], list[memoryview]]] = {}
        self._arenas: dict[tuple[str, int, tuple[int, ...]], SharedArena] = {}
        self._broken: BaseException | None = None
        self._closed = False

    # -- public collectives ------------------------------------------------------
    def allreduce(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None) -> np.ndarray:
        """Reduce ``array`` elementwise over the group; every member gets the same bits."""
        boards = self._boards
        if boards is not None and group is None:
            if type(array) is np.ndarray and array.flags.c_contiguous:
                plan = boards.plans.get((array.dtype, array.shape, op))
                if plan is not None and self._broken is None and not self._closed:  # the hot path: see board.py
                    return self._allreduce_on_board(plan, array, op)  # (its signature passed _prepare's checks)
            x = self._prepare(array, op)
            plan = boards.plan_for(x, op)
            if plan is not None:
                return self._allreduce_on_board(plan, x, op)
        else:
            x = self._prepare(array, op)
        call = self._call(ALLREDUCE, x, group, op=op)
        g = call.group
        if len(g.members) == 1:
            result = x.copy()
        elif g.hierarchical or (x.nbytes > SHARED_BYTES and g.one_host and SharedArena.available()):
            try:
                if g.hierarchical:
                    result = allreduce_hierarchical(self, self.arena_for, call, x, op)
                else:
                    result = allreduce_shared(self, self.arena_for(g), call, x, UFUNCS[op])
            except FabricError as exc:  # (run marked the fabric already; shared-memory checks did not)
                self.fail(exc)
                raise
        else:
            result = sockets.allreduce_flat_or_chunked(self, call, x, op)
        if op == "mean":
            np.divide(result, len(g.members), out=result, casting="unsafe")
        return result

    def broadcast(self, array: np.ndarray, root: int = 0, group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """The root's array, on every member (the others pass an array of the same dtype and shape), in ``out``
        if given (``out=array``: in place; a bad ``out`` raises after the call: ``algorithms/outputs.py``)."""
        x = self._prepare(array, None)
        g = self._group(group)
        if root not in g.members:
            raise ValueError(f"broadcast root {root} is not in the group {list(g.members)}")
        result, x, bad = result_for(out, x, x.shape)
        root_rank = g.members.index(root)
        plan = None if self._copies is None or g.members != self._everyone else self._copies.plan_for(x, root_rank)
        if plan is not None:  # the world group's small broadcast on this host's boards (algorithms/board_copies.py)
            plan.out = result
            self._copy_on_board(plan, x, BROADCAST, root)
        elif x.nbytes > SHARED_BYTES and len(g.members) > 1 and g.one_host and SharedArena.available():
            self._copy_shared(broadcast_shared, self._call(BROADCAST, x, group, root=root), x, result, root_rank)
        else:
            if self.instance == root and result is not x:
                result[...] = x
            if len(g.members) > 1:
                sockets.broadcast(self, self._call(BROADCAST, x, group, root=root), x, result, root_rank)
        if bad:
            raise ValueError(bad)
        return result

    def allgather(self, array: np.ndarray, group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """Every member's array, stacked in member order: shape ``(len(group), *array.shape)``, in ``out`` if
        given (a bad ``out`` raises after the call: ``algorithms/outputs.py``)."""
        x = self._prepare(array, None)
        members = self._group(group).members
        result, x, bad = result_for(out, x, (len(members), *x.shape))
        plan = None if self._copies is None or members != self._everyone else self._copies.plan_for(x)
        if plan is not None:  # the world group's small allgather on this host's boards (algorithms/board_copies.py)
            plan.out = result
            self._copy_on_board(plan, x, ALLGATHER)
        else:
            call = self._call(ALLGATHER, x, group)
            g = call.group
            if len(g.members) > 1 and result.nbytes > SHARED_BYTES and g.one_host and SharedArena.available():
                self._copy_shared(allgather_shared, call, x, result)  # (fills ``result``)
            else:
                sockets.allgather(self, call, x, result)
        if bad:
            raise ValueError(bad)
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
        result = sockets.reduce_scatter(self, call, x.reshape(len(g.members), x.shape[0] // len(g.members),
                                                              *x.shape[1:]), op)
        if op == "mean":
            np.divide(result, len(g.members), out=result, casting="unsafe")
        return result

    def barrier(self, group: Sequence[int] | None = None) -> None:
        """Return once every member of the group has entered the barrier."""
        sockets.barrier(self, self._call(BARRIER, None, group))

    def transports(self) -> dict[int, str]:
        """How each peer is reached: "tcp", "unix", or "unix+mailbox" (shared-memory mailboxes beside it)."""
        return {peer: ("unix" if link.local else "tcp") + ("+mailbox" if link.mailbox is not None else "")
                for peer, link in sorted(self._links.items())}

    def close(self) -> None:
        """Release the links and leave the rendezvous cleanly. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for link in self._links.values():
            link.close()
        self._links.clear()
        self._scratch.clear()
        self._scratch_views.clear()
        self._scratch_sets.clear()
        if self._boards is not None:
            self._boards.close()  # (before the mailboxes)
            self._copies.close()  # type: ignore[union-attr]  # (made with the boards)
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()
        if self._mailboxes is not None:
            self._mailboxes.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- algorithms over sockets, and the phases (``algorithms.protocol.Phases``) the others run over -
    def _allreduce_on_board(self, plan: BoardAllreduce, x: np.ndarray, op: str) -> np.ndarray:
        """The world group's small allreduce through the boards (algorithms/board.py), ``x`` checked already."""
        seq = self._seq[self._everyone] = self._seq[self._everyone] + 1
        try:
            result = plan.allreduce(seq, x, SPIN_SECONDS)
            if result is not None:
                return result
        except BaseException as exc:
            self._broken_by(exc)
            raise
        # the general path receives the peers' frames (nothing is taken yet), or raises why they cannot come;
        # without spinning again: the board's wait spun already, so a peer that is still late is slept on
        call = self._call(ALLREDUCE, x, None, op=op, seq=seq)
        g = call.group
        scratch, views = self.scratch_for(g, x)
        self._exchange(call, Phase.FIRST, [], list(zip(g.other_links, views)), spin=0.0)
        return plan.reduce([*scratch[:g.rank], x, *scratch[g.rank:]])

    def _copy_on_board(self, plan: BoardAllgather, x: np.ndarray, kind: int, root: int = -1) -> np.ndarray:
        """The world group's small broadcast or allgather through the boards (algorithms/board_copies.py: the
        allreduce's path, so its fallback too), ``x`` checked already; fills ``plan.out``."""
        call = self._call(kind, x, None, root=root)  # (numbered, and the general path's header if it falls back)
        try:
            result = plan.allreduce(call.seq, x, SPIN_SECONDS)
        except BaseException as exc:
            self._broken_by(exc)
            raise
        if result is not None:
            return result
        g = call.group  # the general path receives the peers' frames (as ``_allreduce_on_board``)
        scratch, views = self.scratch_for(g, x)
        self._exchange(call, Phase.FIRST, [], list(zip(g.other_links, views)), spin=0.0)
        return plan.reduce([*scratch[:g.rank], x, *scratch[g.rank:]])

    def receive_into_scratch(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
                             like: np.ndarray) -> dict[int, np.ndarray]:
        """Send ``payloads`` (a frame per rank) and receive one ``like``-shaped array from every other member.
        (One payload to every member is ``run_all`` with ``scratch_for``: the small collectives' hot path.)"""
        ranks = call.group.others
        scratch = [self._scratch_array(k, like) for k in ranks]
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
        """Broadcast or allgather through shared memory (``algorithms/shared_copies.py``), marking the fabric
        broken if it fails."""
        try:
            return algorithm(self, self.arena_for(call.group, "copy"), call, *args)
        except FabricError as exc:  # (run marked the fabric already; shared-memory checks did not)
            self.fail(exc)
            raise

    def fail(self, exc: FabricError) -> None:
        """A collective broke outside ``run`` (shared memory): the fabric is unusable from now on."""
        self._broken = self._broken or exc

    # -- plumbing ------------------------------------------------------------------
    def _break(self, exc: FabricError, notice: bytes) -> None:
        """Mark the fabric unusable and tell every peer whose stream is at a frame boundary why."""
        self._broken = exc
        for link in self._links.values():
            link.send_notice(notice)

    def scratch_for(self, g: Group, like: np.ndarray) -> tuple[list[np.ndarray], list[memoryview]]:
        """A ``like``-shaped scratch array per other member of ``g`` (in ``g.others`` order) and their bytes,
        looked up once per call: with more instances than cores each microsecond here costs every instance."""
        key = (g.members, like.dtype, like.shape)
        cached = self._scratch_sets.get(key)
        if cached is None:
            if len(self._scratch_sets) >= 64:
                self._scratch_sets.clear()
            pairs = [self._scratch_array(k, like) for k in g.others]
            cached = self._scratch_sets[key] = ([a for a, _ in pairs], [v for _, v in pairs])
        return cached

    def _scratch_array(self, rank: int, like: np.ndarray) -> tuple[np.ndarray, memoryview]:
        """A ``like``-shaped array (and its bytes) to receive rank ``rank``'s frame into, reused across calls."""
        key = (rank, like.dtype, like.shape)
        cached = self._scratch_views.get(key)
        if cached is not None:
            return cached
        buffer = self._scratch.get(rank)
        if buffer is None or buffer.nbytes < like.nbytes:
            buffer = self._scratch[rank] = np.empty(max(like.nbytes, 64), dtype=np.uint8)
            self._scratch_views = {k: v for k, v in self._scratch_views.items() if k[0] != rank}
        if len(self._scratch_views) >= 64:
            self._scratch_views.clear()
        array = buffer[:like.nbytes].view(like.dtype).reshape(like.shape)
        cached = self._scratch_views[key] = (array, to_bytes(array))
        return cached

    def _prepare(self, array: np.ndarray, op: str | None) -> np.ndarray:
        """A C-contiguous, native-byte-order view or copy of ``array``, checked for the op."""
        self._check_usable()
        x = np.asarray(array)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)  # (never for 0-d arrays, which it would make 1-d)
        if x.dtype.kind not in "biufc":
            raise TypeError(f"the fabric moves numeric arrays; got dtype {x.dtype}")
        if op is not None:
            if op not in UFUNCS:
                raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(UFUNCS)}")
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
              root: int = -1, seq: int = 0) -> Call:
        """The next call on the group (``seq``: one numbered already)."""
        if x is None:
            self._check_usable()
        g = self._group(group)
        if not seq:
            seq = self._seq[g.members] = self._seq[g.members] + 1
        return Call(kind, OP_CODES[op] if op else 0, "" if x is None else x.dtype.str,
                    () if x is None else tuple(x.shape), root, seq, g, g.members)

    def _group(self, group: Sequence[int] | None) -> Group:
        members = self._everyone if group is None else tuple(int(i) for i in group)
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
        g = self._groups[members] = make_group(self.membership, self._links, members)
        self._seq[members] = 0
        return g
