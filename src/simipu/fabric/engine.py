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
  broadcast, the allgather, the reduce_scatter and the barrier;
* point to point (``send``/``recv``, for mpi4py's): one frame on the link
  between two instances, numbered per direction; the sender does not wait for
  the receiver, and while it waits for room it takes every peer's messages
  (frames/messages.py); a collective's receive that meets the peer's next
  message sets it aside for the later ``recv`` (``Link.divert``), as MPI
  buffers a message sent before a collective and received after it.

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
and each member that receives one raises too and passes it on. (The small
broadcast among three members or more on one host is the exception: its root
writes and returns, and learns of a mismatch at its next collective or when
its fabric closes, which waits for that: ``algorithms/board_copies.py``.)

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

from collections import deque
from typing import Callable, Sequence

import numpy as np

from .algorithms import sockets
from .algorithms.calls import UFUNCS, Call, Group, to_bytes
from .algorithms.hierarchical import allreduce_hierarchical
from .algorithms.outputs import out_problem, result_for
from .algorithms.phases import Phase
from .algorithms.shared import SHARED_BYTES, SharedArena, allreduce_shared
from .algorithms.shared_copies import allgather_shared, broadcast_shared
from .errors import CollectiveMismatchError, FabricError
from .frames.header import (
    ALLGATHER,
    ALLREDUCE,
    BARRIER,
    BROADCAST,
    MESSAGE,
    NBYTES,
    REDUCE_SCATTER,
    Signature,
    collective_of,
    met_collective_message,
    mismatch_message,
)
from .frames.link import Link, LinkClosed, post
from .frames.messages import NOTHING_WAITS, NoMessageCanCome, Source, look, send_taking, take_first, take_message
from .planned import PlannedPaths
from .runner import SPIN_SECONDS


class Fabric(PlannedPaths):
    """One instance's end of the job's collectives (see the module docstring for the algorithms)."""

    # -- public collectives ------------------------------------------------------
    def allreduce(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """Reduce ``array`` elementwise over the group; every member gets the same bits, in ``out`` if given
        (``out=array``: in place; a bad ``out`` raises after the call: ``algorithms/outputs.py``)."""
        boards = self._boards
        if boards is not None and group is None and type(array) is np.ndarray and array.flags.c_contiguous:
            plan = boards.plans.get((array.dtype, array.shape, op))  # (none once the fabric broke or closed)
            if plan is not None and (out is None or out is plan.checked_out and array is plan.checked_for):
                return plan.allreduce(0, array, out)  # (a hot call: ``PlannedPaths.hot_allreduces``)
        if out is not None:
            return self._allreduce_into(array, op, group, out)
        x = self._prepare(array, op)
        if boards is not None and group is None:
            plan = boards.plan_for(x, op)
            if plan is not None:
                return plan.allreduce(0, x)
        return self._allreduce_checked(x, op, group)

    def _allreduce_checked(self, x: np.ndarray, op: str, group: Sequence[int] | None,
                           out: np.ndarray | None = None) -> np.ndarray:
        """``allreduce`` of a checked ``x`` that no board plan takes, into ``out`` (apart from ``x``) or a new
        array."""
        if self._boards is not None and group is None and x.nbytes > SHARED_BYTES:
            shared = self._whole_on_board(x, op, out)
            if shared is not None:
                self._steady_whole(x, op, self._allreduce_general)  # the next such call: straight here
                return shared
        return self._allreduce_general(x, op, group, out)

    def _allreduce_general(self, x: np.ndarray, op: str, group: Sequence[int] | None,
                           out: np.ndarray | None = None) -> np.ndarray:
        """``_allreduce_checked`` past the one-phase layout's board plan (which did nothing): the general
        paths, through shared memory, hierarchical, or the sockets."""
        call = self._call(ALLREDUCE, x, group, op=op)
        g = call.group
        if len(g.members) == 1:
            result = x.copy()
        elif g.hierarchical or (x.nbytes > SHARED_BYTES and g.one_host and SharedArena.available()):
            try:
                if g.hierarchical:
                    result = allreduce_hierarchical(self, self.arena_for, call, x, op)
                else:
                    result = allreduce_shared(self, self.arena_for(g), call, x, UFUNCS[op], out)
                    self._settle(call.seq)
            except FabricError as exc:  # (run marked the fabric already; shared-memory checks did not)
                self.fail(exc)
                raise
        else:
            result = sockets.allreduce_flat_or_chunked(self, call, x, op)
        if out is not None and result is not out:
            np.copyto(out, result)
            result = out
        if op == "mean":
            np.divide(result, len(g.members), out=result, casting="unsafe")
        return result

    def _allreduce_into(self, array: np.ndarray, op: str, group: Sequence[int] | None, out: np.ndarray) -> np.ndarray:
        """``allreduce`` into the caller's ``out``: checked first (a bad one takes a result of its own, so the
        peers finish the call, then raises); a board plan reduces into it straight, and remembers the pair so
        that the next call with the same two arrays takes the hot path."""
        x = self._prepare(array, op)
        bad = out_problem(out, x.shape, x.dtype)
        if bad:
            self.allreduce(x, op, group)
            raise ValueError(bad)
        apart = not np.may_share_memory(out, x)
        plan = self._boards.plan_for(x, op) if self._boards is not None and group is None else None
        # in place (``out is x``) when our array is one of the first two reduced: a ufunc reads each element
        # before it writes it, and the later ones read only the peers'
        if plan is not None and ((out is x and self._group(None).rank < 2) or apart):
            if x is array:
                plan.checked_out, plan.checked_for = out, x
            return plan.allreduce(0, x, out)
        if plan is None and apart:  # (a large one straight into ``out``: no second copy)
            return self._allreduce_checked(x, op, group, out)
        np.copyto(out, self.allreduce(x, op, group))
        return out

    def allreduce_init(self, array: np.ndarray, op: str = "sum",
                       group: Sequence[int] | None = None) -> Callable[[], np.ndarray]:
        """A persistent allreduce (MPI 4's ``MPI_Allreduce_init``): a callable that allreduces ``array``'s current
        contents, as ``allreduce`` would, into one output array it returns each time (overwritten by the next
        call). ``array``'s memory is bound, not copied, so it must be a C-contiguous ndarray in native byte
        order; through a view made now, as an MPI request binds a buffer: a later in-place reshape of ``array``
        (``array.shape = ...``) changes neither the shape reduced nor the output's."""
        x = self._prepare(array, op)
        if x is not array:
            raise ValueError("allreduce_init binds its array, so it needs a C-contiguous numpy.ndarray in native "
                             "byte order; pass np.ascontiguousarray(array) and keep that one")
        x = x.view()
        group = None if group is None or tuple(group) == self._everyone else tuple(group)
        self._group(group)  # (checked now, not at the first call)
        out = np.empty_like(x)
        plan = self._boards.plan_for(x, op) if self._boards is not None and group is None else None
        if plan is None:
            def general() -> np.ndarray:  # (``allreduce``'s checked path, straight into ``out``)
                self._check_usable()
                return self._allreduce_checked(x, op, group, out)
            return general
        payload = to_bytes(x)

        def on_board() -> np.ndarray:
            if self._broken is not None or self._closed:
                self._check_usable()
            return plan.allreduce(0, x, out, payload)
        return on_board

    def broadcast(self, array: np.ndarray, root: int = 0, group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """The root's array, on every member (the others pass an array of the same dtype and shape), in ``out``
        if given (``out=array``: in place; a bad ``out`` raises after the call: ``algorithms/outputs.py``)."""
        copies = self._copies
        if copies is not None and group is None and type(array) is np.ndarray and array.flags.c_contiguous:
            plan = copies.plans.get((root, array.dtype, array.shape))  # the hot path, as ``allreduce``'s
            if plan is not None and (out is None or out is plan.checked_out and array is plan.checked_for):
                return plan.allreduce(0, array, np.empty_like(array) if out is None else out)
        x = self._prepare(array, None)
        g = self._group(group)
        if root not in g.members:
            raise ValueError(f"broadcast root {root} is not in the group {list(g.members)}")
        result, x, bad = result_for(out, x, x.shape)
        root_rank = g.members.index(root)
        plan = None if self._copies is None or g.members != self._everyone else self._copies.plan_for(x, root_rank)
        if plan is not None:  # the world group's small broadcast on this host's boards (algorithms/board_copies.py)
            plan.remember(array, out, x, result)
            plan.allreduce(0, x, result)
        elif x.nbytes > SHARED_BYTES and len(g.members) > 1 and g.one_host and SharedArena.available():
            if group is not None or not self._copy_steady(x, result, root_rank):
                self._copy_shared(broadcast_shared, self._call(BROADCAST, x, group, root=root), x, result, root_rank)
            if group is None and self._copies is not None:  # the next such call: straight to the shm paths
                self._steady_copy(x, root_rank).remember(array, out, x, result)
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
        copies = self._copies
        if copies is not None and group is None and type(array) is np.ndarray and array.flags.c_contiguous:
            plan = copies.plans.get((-1, array.dtype, array.shape))  # the hot path, as ``allreduce``'s
            if plan is not None and (out is None or out is plan.checked_out and array is plan.checked_for):
                return plan.allreduce(0, array, np.empty((self.num_instances, *array.shape), array.dtype)
                                      if out is None else out)
        x = self._prepare(array, None)
        members = self._group(group).members
        result, x, bad = result_for(out, x, (len(members), *x.shape))
        plan = None if self._copies is None or members != self._everyone else self._copies.plan_for(x)
        if plan is not None:  # the world group's small allgather on this host's boards (algorithms/board_copies.py)
            plan.remember(array, out, x, result)
            plan.allreduce(0, x, result)
        elif self._boards is None or members != self._everyone or not self._copy_steady(x, result, -1):
            call = self._call(ALLGATHER, x, group)
            g = call.group
            if len(g.members) > 1 and result.nbytes > SHARED_BYTES and g.one_host and SharedArena.available():
                self._copy_shared(allgather_shared, call, x, result)  # (fills ``result``)
                if group is None and self._copies is not None:  # (as ``broadcast``'s)
                    self._steady_copy(x, -1).remember(array, out, x, result)
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

    # -- point to point (mpi4py's send and recv: ``popdist.mpi4py``) ----------------------------------------
    def send(self, array: np.ndarray, dest: int) -> None:
        """``array`` to instance ``dest``, as one frame on our link, returning once it is written there (to the
        link's mailbox or socket), not once it is received: MPI's standard send. Without room on the link it
        waits, taking every peer's messages to us meanwhile (``frames.messages``), so that instances that all
        send first never wait on each other. ``dest`` takes it with ``recv``; messages between two instances
        arrive in the order they were sent."""
        x = self._prepare(array, None)
        call, link = self._message(x, self.instance, dest)
        try:
            pending = post(link, call.prefix(Phase.FIRST) + NBYTES.pack(x.nbytes), to_bytes(x))
            if pending is not None:  # no room on the link: take the peers' messages while we wait (messages.py)
                peers = [dest, *(peer for peer in self._links if peer != dest)]
                send_taking(pending, link, [self._source(peer) for peer in peers], self._watch, self._mailboxes,
                            call.scope)
        except BaseException as exc:
            raise self._broken_by_message(exc, call.scope) from None

    def take_waiting(self, source: int) -> bytearray:
        """The payload of ``source``'s next message, which has come (``message_waiting`` said so), whatever its
        dtype and shape: for a receiver that learns a message's size from the message itself."""
        kept = self._kept.get(source)
        if not kept:
            raise RuntimeError(f"no message from instance {source} has come: ask message_waiting first")
        key = (source, self.instance)
        self._messages[key] = self._messages.get(key, 0) + 1
        return kept.popleft()[1]

    def recv(self, like: np.ndarray, source: int, out: np.ndarray | None = None) -> np.ndarray:
        """The next message from instance ``source``, as a new array, or into ``out`` (``like`` itself, or with
        its dtype and shape; C-contiguous); it must have ``like``'s dtype and shape (a message of another raises
        ``CollectiveMismatchError``, as a mismatched collective does)."""
        result = np.empty_like(self._prepare(like, None)) if out is None else out
        call, link = self._message(result, source, self.instance)
        kept = self._kept.get(source)
        if kept:  # taken early: while a send of ours waited for room, by ``message_waiting``, or set aside
            theirs, payload = kept.popleft()
            mine = call.signature(Phase.FIRST)
            if theirs != mine or len(payload) != result.nbytes:
                error = CollectiveMismatchError(mismatch_message(self.instance, mine, source, theirs, call.scope))
                self._broken_by(error)
                raise error
            to_bytes(result)[:] = payload
            return result
        self._exchange(call, Phase.FIRST, [], [(link, to_bytes(result))])
        return result

    def message_waiting(self, sources: Sequence[int], block: bool = False, watched: Sequence[int] = (),
                        called: str | None = None) -> int | None:
        """The first of ``sources`` (then of ``watched``) whose next message to us has come (so that ``recv``
        from it returns without waiting for that message's first frame), or None if none has; with ``block``,
        waits for one (as long as it takes, as ``recv``, taking meanwhile every other peer's messages into its
        kept queue: a peer waiting for room for a message to us is not left waiting on this wait). ``watched``
        peers' messages end the wait too, for a caller that has receives of theirs to match (MPI's progress),
        but it is not for them: when every one of ``sources`` has called a collective first, none can send
        before we join it: ``CollectiveMismatchError``, here and (by notice) on them, rather than a wait that
        never ends. ``called``: the collective this wait is a part of, if its parts travel as messages (mpi4py's
        all-to-all), for that error to name."""
        self._check_usable()
        if self.instance in sources or self.instance in watched:
            raise ValueError(f"a message needs two instances; instance {self.instance} waits for one from itself")
        waited = [*sources, *watched]
        scope = sorted({self.instance, *waited})
        try:
            wanted = [self._source(peer) for peer in waited]
            found = take_first(wanted, self._watch, self._mailboxes, scope, False)
            if found is None:  # (the others' sources made only for a wait: a message there is the rule)
                others = [self._source(peer) for peer in self._links if peer not in waited]
                if block:
                    found = take_first(wanted, self._watch, self._mailboxes, scope, True, others, SPIN_SECONDS,
                                       len(sources))
                else:  # (one more of the others' messages taken into its kept queue at each look: a program
                    look(others, NOTHING_WAITS, 0)  # polling for one rank lets another's large send go on)
        except NoMessageCanCome as stuck:
            them = " and ".join(f"instance {sources[k]} called {theirs.describe()}"
                                for k, theirs in sorted(stuck.calls.items()))
            ours = "" if called is None else f" (instance {self.instance} called {called}, whose blocks travel as " \
                                             "messages)"
            raise self._broken_by_message(CollectiveMismatchError(
                f"instance {self.instance} waits for a message from instance(s) {', '.join(map(str, sources))} "
                f"but {them} first: no message can come before this instance joins it{ours}"), scope) from None
        except BaseException as exc:
            raise self._broken_by_message(exc, scope) from None
        return None if found is None else waited[found]

    def _broken_by_message(self, exc: BaseException, scope: Sequence[int]) -> BaseException:
        """What stopped a point-to-point wait among ``scope`` (``send``, ``message_waiting``) breaks the fabric,
        as a collective's would; the error to raise: a closed link's as the loss of the instance the rendezvous
        names. (An ``except`` at the call, not a context manager: a send is a few microseconds.)"""
        if isinstance(exc, LinkClosed):
            exc = (self._told_before_closing(exc.peer)
                   or self._watch.explain(exc.peer, exc.reason, set(scope) - {self.instance}))
        self._broken_by(exc)
        return exc

    def _told_before_closing(self, peer: int) -> CollectiveMismatchError | None:
        """The mismatch ``peer`` told us of before its link closed, if its notice is there behind its messages: a
        peer that found our exchange's block where it waited for a collective's frame says so and ends, while
        our send may still wait for room (``runner.PhaseRunner._drop_messages``)."""
        link = self._links.get(peer)
        try:
            if link is not None:
                self._drop_messages(link)
        except CollectiveMismatchError as notice:
            return notice
        except (LinkClosed, FabricError, OSError):  # (nothing more to read: the loss is the error)
            pass
        return None

    def _set_aside(self, link: Link) -> bool:
        """A collective's receive met a frame it did not expect on ``link``: if it is the peer's next message to
        us, take it into the peer's kept queue for our later ``recv`` (True), as MPI buffers a message that
        comes before its receive; the collective then takes the frame after it."""
        _, ours, kept = self._source(link.peer)
        return take_message(link, ours, kept, NOTHING_WAITS) is None

    def _set_aside_unanswered(self, call: Call, link: Link) -> bool:
        """``_set_aside``, for ``call``, which waits for the frame of ``link``'s peer and sends it nothing (a small
        broadcast's reader: ``algorithms/board_copies.py``'s ``RootBroadcast``); then ``_unanswered``."""
        if not self._set_aside(link):
            return False
        self._unanswered(call, link.peer)
        return True

    def _unanswered(self, call: Call, peer: int) -> None:
        """Raise ``CollectiveMismatchError`` if ``peer``'s messages to us not received yet are a part of its own
        collective (``header.collective_of``: mpi4py's all-to-all): while ``call`` waits for the peer's frame and
        sends it nothing, the peer waits in that collective for us, and cannot see that we are in another."""
        called = collective_of(peer, [payload for _, payload in self._source(peer)[2]])
        if called is not None:
            raise CollectiveMismatchError(met_collective_message(self.instance, call.signature(Phase.FIRST), peer,
                                                                 called))

    def _source(self, peer: int) -> Source:
        """``peer``'s link as a wait for its messages sees it (``frames.messages.Source``): the link, whether a
        frame's header is its next message to us that its kept queue does not hold yet, and that queue."""
        made = self._sources.get(peer)
        if made is not None:
            return made  # (made below: the link, the test, the queue never change)
        g = self._pair(peer)
        kept = self._kept.setdefault(peer, deque())
        key = g.key
        numbers, mine = self._messages, (peer, self.instance)

        def ours(theirs: Signature) -> bool:
            return (theirs.kind == MESSAGE and theirs.root == peer and theirs.group_key == key
                    and theirs.seq == numbers.get(mine, 0) + len(kept) + 1)
        link = g.links[g.members.index(peer)]
        assert link is not None, "a peer's link (only our own is None)"
        source = self._sources[peer] = (link, ours, kept)
        return source

    def _pair(self, peer: int) -> Group:
        """The group of this instance and ``peer`` (checked once, then cached)."""
        g = self._pairs.get(peer)
        if g is None:
            g = self._pairs[peer] = self._group(tuple(sorted((self.instance, peer))))
        return g

    def _message(self, x: np.ndarray, source: int, dest: int) -> tuple[Call, Link]:
        """The call of the next message from ``source`` to ``dest`` (numbered per direction, so that two
        instances may both send before they receive), and the link it travels on."""
        peer = dest if source == self.instance else source
        if peer == self.instance:
            raise ValueError(f"a message needs two instances; instance {peer} sent to itself")
        g = self._pair(peer)
        seq = self._messages[(source, dest)] = self._messages.get((source, dest), 0) + 1
        link = g.links[g.members.index(peer)]
        assert link is not None, "a peer's link (only our own is None)"
        return Call(MESSAGE, 0, x.dtype.str, tuple(x.shape), source, seq, g, g.members), link
