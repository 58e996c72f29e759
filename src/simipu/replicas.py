"""One program per local replica, with in-program cross-replica collectives.

An instance holds ``num_local_replicas`` replicas; each runs the same function
in a thread of its own (NumPy releases the GIL in the heavy parts). A
cross-replica op first combines the instance's replicas in local-index order,
then one instance-level collective combines the instances in instance order,
so every replica of every instance gets the same, deterministic result; a
replica's global index is the instance's replica offset + its local index.
If one replica raises, the others are released (not left waiting) and
``run_replicas`` re-raises the first error; so are they when one's program
returns while they wait in an op, and replicas that call different ops raise
``CollectiveMismatchError`` (``_ReplicaMeeting``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .fabric.errors import CollectiveMismatchError


class InstanceCollectives(Protocol):
    def allreduce(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None) -> np.ndarray: ...
    def broadcast(self, array: np.ndarray, root: int = 0, group: Sequence[int] | None = None) -> np.ndarray: ...
    def allgather(self, array: np.ndarray, group: Sequence[int] | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class ReplicaLayout:
    """Where this instance's replicas sit among all replicas."""

    num_total_replicas: int
    num_local_replicas: int
    replica_offset: int

    @property
    def instance(self) -> int:
        return self.replica_offset // self.num_local_replicas


class _ReplicaMeeting:
    """The instance's replicas meet here for each op; replica 0 does the instance-level part.

    Each other replica hands its value over and waits for the result; replica 0 waits for every value,
    combines them and hands the result out. Two hand-offs an op, each a plain lock per replica (its
    ``arrived`` released by the replica, taken by replica 0; its ``ready`` the other way), where a
    ``threading.Barrier`` (a condition variable, in Python) took three rounds: a ``cross_replica_sum`` of
    up to 38 KiB for 2 instances x 2 replicas takes 17-21 us against 53-58 us (``benchmarks/replicas.py``).
    The slots are safe to reuse without a third round: replica 0 reads them for op k+1 only once every
    replica has arrived at it, which each does after copying op k's result.

    The replicas must make the same ops in the same order, as instances must make the same collectives:
    replica 0 compares every replica's call (kind, op or root, dtype, shape) with its own before combining,
    and a mismatch raises ``CollectiveMismatchError`` on every replica, naming both calls (a wrong result
    otherwise: replica 0's combine decides for all). A replica whose program returns leaves the meeting: any
    op not yet complete can no longer be, so the replicas waiting in it, or arriving later, raise at once
    instead of waiting forever."""

    def __init__(self, fabric: InstanceCollectives, layout: ReplicaLayout) -> None:
        self.fabric = fabric
        self.layout = layout
        n = layout.num_local_replicas
        self.slots: list[Any] = [None] * n
        #: Each replica's call for the op in its slot: its name (for messages) and what must match.
        self.calls: list[tuple[str, tuple[Any, ...]]] = [("", ())] * n
        self.result: Any = None
        #: Per replica (replica 0's unused): released when its value is in its slot, and when the result is out.
        self._arrived = [threading.Lock() for _ in range(n)]
        self._ready = [threading.Lock() for _ in range(n)]
        for lock in (*self._arrived, *self._ready):
            lock.acquire()
        #: Ops whose result replica 0 has handed out: a replica woken without its op counted was released.
        self._done = 0
        #: Why no op can complete any more (None while one can): ``BrokenBarrierError`` when a replica raised
        #: (its own error is the one ``run_replicas`` raises), else the mismatch or the departure to raise.
        self._failure: BaseException | None = None

    def exchange(self, local_index: int, value: np.ndarray, call: tuple[str, tuple[Any, ...]],
                 combine: Callable[[list[np.ndarray]], np.ndarray]) -> np.ndarray:
        """This replica's part of one op: everyone's ``value`` combined by replica 0, a copy for each.
        ``call``: the op's name and what every replica's call must agree on (``ReplicaContext``'s)."""
        if self._failure is not None:
            raise self._failure
        self.slots[local_index] = np.ascontiguousarray(value)
        self.calls[local_index] = call
        if local_index:
            done = self._done  # (replica 0 counts this op only once we have arrived)
            _release(self._arrived[local_index])  # (free already if a replica failed meanwhile: ``fail``)
            self._ready[local_index].acquire()
            if self._done == done:  # released, not served: the op cannot complete
                raise self._failure or threading.BrokenBarrierError()
            return self.result.copy()
        for lock in self._arrived[1:]:
            lock.acquire()
            if self._failure is not None:
                raise self._failure
        mismatch = self._mismatch()
        if mismatch is not None:
            self.fail(mismatch)
            raise mismatch
        try:
            result = self.result = combine(self.slots)
        except BaseException:
            self.abort()
            raise
        self._done += 1
        for lock in self._ready[1:]:
            _release(lock)  # (a replica that failed meanwhile has released them all: ``fail``)
        return result.copy()

    def _mismatch(self) -> CollectiveMismatchError | None:
        """The error to raise if some replica's call differs from replica 0's, else None."""
        name, key = self.calls[0]
        for k, (other_name, other_key) in enumerate(self.calls[1:], 1):
            if other_key != key:
                first = self.layout.replica_offset
                return CollectiveMismatchError(
                    f"replicas of instance {self.layout.instance} made different cross-replica calls: "
                    f"replica {first} {_described(name, key)}, replica {first + k} {_described(other_name, other_key)}"
                    "; every replica must make the same cross-replica calls, in the same order")
        return None

    def leave(self, local_index: int) -> None:
        """Replica ``local_index``'s program returned: an op not complete yet never will be, so the replicas
        in it, or coming to one, raise (the first reason a meeting failed stands)."""
        replica = self.layout.replica_offset + local_index
        self.fail(CollectiveMismatchError(
            f"replica {replica}'s program returned while other replicas of instance {self.layout.instance} "
            "still made cross-replica calls; every replica must make the same cross-replica calls, in the same order"))

    def abort(self) -> None:
        """A replica failed: every replica waiting here, or arriving later, raises ``BrokenBarrierError``."""
        self.fail(threading.BrokenBarrierError())

    def fail(self, failure: BaseException) -> None:
        """No op can complete from now on: ``failure`` (unless one came first) for every replica waiting here
        or arriving later."""
        if self._failure is None:
            self._failure = failure
        for lock in (*self._arrived, *self._ready):
            _release(lock)


def _described(name: str, key: tuple[Any, ...]) -> str:
    """A replica's call as a message names it: ``called cross_replica_sum on float32 (2, 3)`` (and a broadcast's root)."""
    kind, detail, dtype, shape = key
    root = f" from replica {detail}" if kind == "broadcast" else ""
    return f"called {name}{root} on {dtype.name} {shape}"


def _release(lock: threading.Lock) -> None:
    """Release ``lock`` unless it is free already (``abort`` may have freed it first)."""
    try:
        lock.release()
    except RuntimeError:
        pass


class ReplicaContext:
    """What one replica's program sees: its indices and the cross-replica ops."""

    def __init__(self, local_index: int, meeting: _ReplicaMeeting) -> None:
        self._meeting = meeting
        layout = meeting.layout
        self.local_index = local_index
        self.index = layout.replica_offset + local_index
        self.num_replicas = layout.num_total_replicas
        self.num_local_replicas = layout.num_local_replicas

    def _reduce(self, value: Any, op: str, name: str) -> np.ndarray:
        fabric = self._meeting.fabric

        def combine(slots: list[np.ndarray]) -> np.ndarray:
            local = slots[0].copy()
            for other in slots[1:]:  # local-index order: deterministic
                if op == "sum":
                    local += other
                elif op == "max":
                    np.maximum(local, other, out=local)
                else:
                    np.minimum(local, other, out=local)
            return fabric.allreduce(local, op)

        return self._exchange(name, ("reduce", op), value, combine)

    def _exchange(self, name: str, what: tuple[str, Any], value: Any,
                  combine: Callable[[list[np.ndarray]], np.ndarray]) -> np.ndarray:
        """``value``'s part in the op ``name`` (``what``: its kind and op or root, which every replica's call
        must share, with the array's dtype and shape)."""
        array = np.asarray(value)
        return self._meeting.exchange(self.local_index, array, (name, (*what, array.dtype, array.shape)), combine)

    def cross_replica_sum(self, value: Any) -> np.ndarray:
        return self._reduce(value, "sum", "cross_replica_sum")

    def cross_replica_mean(self, value: Any) -> np.ndarray:
        total = self._reduce(value, "sum", "cross_replica_mean")
        return total / self.num_replicas

    def cross_replica_max(self, value: Any) -> np.ndarray:
        return self._reduce(value, "max", "cross_replica_max")

    def cross_replica_min(self, value: Any) -> np.ndarray:
        return self._reduce(value, "min", "cross_replica_min")

    def cross_replica_allgather(self, value: Any) -> np.ndarray:
        """Every replica's value in global replica order: shape (replicas, *shape)."""
        fabric, layout = self._meeting.fabric, self._meeting.layout

        def combine(slots: list[np.ndarray]) -> np.ndarray:
            gathered = fabric.allgather(np.stack(slots))
            return gathered.reshape((layout.num_total_replicas, *slots[0].shape))

        return self._exchange("cross_replica_allgather", ("allgather", None), value, combine)

    def cross_replica_broadcast(self, value: Any, root: int = 0) -> np.ndarray:
        """Every replica gets replica ``root``'s value."""
        fabric, layout = self._meeting.fabric, self._meeting.layout
        if not 0 <= root < layout.num_total_replicas:
            raise ValueError(f"replica {root} does not exist (0 to {layout.num_total_replicas - 1})")
        owner, local_root = divmod(root, layout.num_local_replicas)

        def combine(slots: list[np.ndarray]) -> np.ndarray:
            return fabric.broadcast(slots[local_root], root=owner)

        return self._exchange("cross_replica_broadcast", ("broadcast", root), value, combine)


def run_replicas(fn: Callable[..., Any], fabric: InstanceCollectives, layout: ReplicaLayout, *args: Any,
                 **kwargs: Any) -> list[Any]:
    """Run ``fn(replica, *args, **kwargs)`` once per local replica; results in local order."""
    meeting = _ReplicaMeeting(fabric, layout)
    results: list[Any] = [None] * layout.num_local_replicas
    errors: list[tuple[int, BaseException]] = []

    def body(local_index: int) -> None:
        try:
            results[local_index] = fn(ReplicaContext(local_index, meeting), *args, **kwargs)
            meeting.leave(local_index)
        except threading.BrokenBarrierError as exc:
            errors.append((local_index, exc))
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append((local_index, exc))
            meeting.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"replica-{layout.replica_offset + i}")
               for i in range(1, layout.num_local_replicas)]
    for thread in threads:
        thread.start()
    body(0)
    for thread in threads:
        thread.join()
    real = [e for e in errors if not isinstance(e[1], threading.BrokenBarrierError)]
    if real or errors:
        local_index, error = (real or errors)[0]
        raise error
    return results
