"""``MPI.Comm`` over the fabric: the communicator of a set of instances (``COMM_WORLD``: all of them).

As in mpi4py, lowercase methods take any picklable Python object (they travel pickled, as mpi4py's do,
between this job's instances only: see ``popdist.ragged``), and uppercase methods take buffer specs
(``specs.buffer_of``). Reductions run in rank order, so every rank gets the same bits. Rooted operations
(``Gather``, ``Reduce``, ``Scatter``) run as their all-to-all forms and keep the root's part: simpler, and
the same result.

Point to point: ``send``/``recv`` (and ``Send``/``Recv``) are MPI's standard mode: ``send`` returns once
its message is on the way (the fabric's ``send``, which takes the peer's messages while it waits for room:
so two ranks may both send before they receive, and a ring of sends completes), and ``recv`` matches by
tag, setting aside the messages that came first with other tags. The source must be named (no ``ANY_SOURCE``). ``Recv`` takes a
message of at most its buffer's bytes, as MPI does.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Any, Sequence

import numpy as np

from popdist import core
from popdist.backend import current_fabric
from popdist.mpi4py.specs import (
    ANY_SOURCE,
    ANY_TAG,
    ERR_TAG,
    ERR_TRUNCATE,
    IN_PLACE,
    README_SECTION,
    SUM,
    MPIException,
    NotProvidedError,
    Op,
    Status,
    buffer_of,
    fill,
)
from popdist.ragged import allgather_objects, broadcast_object

#: Messages received (or sent to ourselves) before a ``recv`` asked for them, by (communicator's context, source
#: instance), each (tag, bytes), in the order they came.
_unclaimed: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
os.register_at_fork(after_in_child=_unclaimed.clear)  # (a forked instance, ``launch()``'s, is not its parent)


class Comm:
    """A communicator: ``members`` are instance indices in rank order (None: every instance)."""

    def __init__(self, members: Sequence[int] | None = None, name: str = "MPI_COMM_WORLD", context: int = 0) -> None:
        self._members = None if members is None else tuple(members)
        self._name = name
        #: Whose messages a ``recv`` here takes: 0 COMM_WORLD, 1 COMM_SELF, a ``Dup``'s derived from its parent's
        #: and the parent's count of ``Dup`` calls (collective in MPI: its ranks call it alike, whatever a rank
        #: does with other communicators, such as COMM_SELF, alone).
        self._context = context
        self._dups = 0

    # -- who ----------------------------------------------------------------------------------------------
    def _group(self) -> tuple[int, ...] | None:
        return self._members

    def Get_size(self) -> int:
        return core.getNumInstances() if self._members is None else len(self._members)

    def Get_rank(self) -> int:
        me = core.getInstanceIndex()
        return me if self._members is None else self._members.index(me)

    size = property(Get_size)
    rank = property(Get_rank)

    def Get_name(self) -> str:
        return self._name

    def _instance(self, rank: int, what: str) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.Get_size():
            raise ValueError(f"{what}: rank {rank!r} is not in {self._name} (0 to {self.Get_size() - 1})")
        return int(rank) if self._members is None else self._members[int(rank)]

    # -- synchronisation ----------------------------------------------------------------------------------
    def Barrier(self) -> None:
        current_fabric().barrier(self._group())

    barrier = Barrier

    # -- Python objects -----------------------------------------------------------------------------------
    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        return broadcast_object(obj, self._instance(root, "bcast"), self._group())

    def allgather(self, sendobj: Any) -> list[Any]:
        return allgather_objects(sendobj, self._group())

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        gathered = self.allgather(sendobj)
        return gathered if self.Get_rank() == root else None

    def scatter(self, sendobj: Sequence[Any] | None = None, root: int = 0) -> Any:
        if self.Get_rank() == root and (sendobj is None or len(sendobj) != self.Get_size()):
            raise ValueError(f"scatter: the root must give a sequence of {self.Get_size()} objects")
        return self.bcast(list(sendobj) if self.Get_rank() == root else None, root)[self.Get_rank()]  # type: ignore[arg-type]

    def allreduce(self, sendobj: Any, op: Op | None = None) -> Any:
        return functools.reduce(op or SUM, self.allgather(sendobj))

    def reduce(self, sendobj: Any, op: Op | None = None, root: int = 0) -> Any:
        result = self.allreduce(sendobj, op)
        return result if self.Get_rank() == root else None

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """MPI's standard send: returns once the message is on its way (see the module docstring)."""
        import pickle

        self._send_bytes(np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8), dest, tag, "send")

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:
        import pickle

        data = self._recv_bytes(source, tag, "recv", status)
        return pickle.loads(data.tobytes())  # noqa: S301 - from this job's own instances only (popdist.ragged)

    def _send_bytes(self, data: np.ndarray, dest: int, tag: int, what: str) -> None:
        """A message to ``dest``: a header (tag, size, context), then its bytes; to ourselves, straight into our
        queue."""
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or tag < 0:
            raise MPIException(ERR_TAG, f"{what}: tag {tag!r} is not a tag: a message's tag is an int from 0")
        peer = self._instance(dest, what)
        if peer == core.getInstanceIndex():
            _unclaimed.setdefault((self._context, peer), []).append((tag, data.copy()))
            return
        fabric = current_fabric()
        fabric.send(np.array([tag, data.size, self._context], np.int64), peer)
        if data.size:
            fabric.send(data, peer)

    def _recv_bytes(self, source: int, tag: int, what: str, status: Status | None) -> np.ndarray:
        """The first message from ``source`` with ``tag`` (any, for ``ANY_TAG``): one that came earlier and was
        set aside, or the next ones to arrive, setting aside those with other tags (as MPI matches by tag)."""
        if source == ANY_SOURCE:
            raise NotProvidedError(f"{what}(source=ANY_SOURCE) is not provided by poprun-py's mpi4py: name the "
                                   f"source rank (see {README_SECTION})")
        peer = self._instance(source, what)
        waiting = _unclaimed.setdefault((self._context, peer), [])
        found = next((k for k, (sent_tag, _) in enumerate(waiting) if tag in (ANY_TAG, sent_tag)), None)
        if found is not None:
            sent_tag, data = waiting.pop(found)
        elif peer == core.getInstanceIndex():
            raise ValueError(f"{what}: no message with tag {tag} was sent to this rank by itself, and none can come")
        else:
            fabric = current_fabric()
            while True:
                sent_tag, nbytes, context = (int(v) for v in fabric.recv(np.empty(3, np.int64), peer))
                data = fabric.recv(np.empty(nbytes, np.uint8), peer) if nbytes else np.empty(0, np.uint8)
                if context == self._context and tag in (ANY_TAG, sent_tag):
                    break
                _unclaimed.setdefault((context, peer), []).append((sent_tag, data))
        if status is not None:
            status.source, status.tag, status.nbytes = source, sent_tag, data.size
        return data

    # -- buffers ------------------------------------------------------------------------------------------
    def Bcast(self, buf: Any, root: int = 0) -> None:
        array = buffer_of(buf, "Bcast", receives=self.Get_rank() != root)
        fill(array, current_fabric().broadcast(array, self._instance(root, "Bcast"), self._group()), "Bcast")

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        recv = buffer_of(recvbuf, "Allreduce", receives=True)
        send = recv if sendbuf is IN_PLACE else buffer_of(sendbuf, "Allreduce")
        fill(recv, current_fabric().allreduce(send, (op or SUM).fabric_op, self._group()), "Allreduce")

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None, root: int = 0) -> None:
        is_root = self.Get_rank() == root
        recv = buffer_of(recvbuf, "Reduce", receives=True) if is_root else None
        if sendbuf is IN_PLACE:
            if recv is None:
                raise ValueError("Reduce: only the root may pass MPI.IN_PLACE")
            send = recv
        else:
            send = buffer_of(sendbuf, "Reduce")
        result = current_fabric().allreduce(send, (op or SUM).fabric_op, self._group())
        if recv is not None:
            fill(recv, result, "Reduce")

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        recv = buffer_of(recvbuf, "Allgather", receives=True)
        send = self._own_block(recv, "Allgather") if sendbuf is IN_PLACE else buffer_of(sendbuf, "Allgather")
        fill(recv, current_fabric().allgather(send, self._group()), "Allgather")

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        is_root = self.Get_rank() == self._rank_checked(root, "Gather")
        recv = buffer_of(recvbuf, "Gather", receives=True) if is_root else None
        if sendbuf is IN_PLACE:
            if recv is None:
                raise ValueError("Gather: only the root may pass MPI.IN_PLACE")
            send = self._own_block(recv, "Gather")
        else:
            send = buffer_of(sendbuf, "Gather")
        gathered = current_fabric().allgather(send, self._group())
        if recv is not None:
            fill(recv, gathered, "Gather")

    def _own_block(self, recv: np.ndarray, what: str) -> np.ndarray:
        """With ``MPI.IN_PLACE``: this rank's block of the receive buffer, where MPI takes its contribution from."""
        size = self.Get_size()
        if recv.size % size:
            raise ValueError(f"{what}: the receive buffer's {recv.size} items do not split into {size} ranks' blocks")
        block = recv.size // size
        return recv[self.Get_rank() * block:(self.Get_rank() + 1) * block].copy()

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        recv = buffer_of(recvbuf, "Scatter", receives=True)
        shape = (self.Get_size(), *recv.shape)
        if self.Get_rank() == self._rank_checked(root, "Scatter"):
            send = buffer_of(sendbuf, "Scatter")
            if send.size != recv.size * self.Get_size():
                raise ValueError(f"Scatter: the root's buffer holds {send.size} elements, "
                                 f"{self.Get_size()} ranks x {recv.size} are needed")
            send = np.ascontiguousarray(send, dtype=recv.dtype).reshape(shape)
        else:
            send = np.empty(shape, recv.dtype)
        everything = current_fabric().broadcast(send, self._instance(root, "Scatter"), self._group())
        fill(recv, everything[self.Get_rank()], "Scatter")

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """``send``'s standard mode, of the buffer's bytes."""
        self._send_bytes(buffer_of(buf, "Send").view(np.uint8), dest, tag, "Send")

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        """The message's bytes into the start of ``buf``, which must have room for them (MPI_ERR_TRUNCATE)."""
        room = buffer_of(buf, "Recv", receives=True).view(np.uint8)
        data = self._recv_bytes(source, tag, "Recv", status)
        if data.size > room.size:
            raise MPIException(ERR_TRUNCATE, f"Recv: message truncated: rank {source} sent {data.size} bytes, the "
                               f"receive buffer holds {room.size}")
        room[:data.size] = data

    def _rank_checked(self, root: int, what: str) -> int:
        self._instance(root, what)
        return int(root)

    # -- the rest -----------------------------------------------------------------------------------------
    def Abort(self, errorcode: int = 0) -> None:
        """Stop this instance at once; poprun then stops the others (a zero code becomes 1, so it does)."""
        print(f"MPI.Abort(errorcode={errorcode}) called by rank {self.Get_rank()} of {self._name}",
              file=sys.stderr, flush=True)
        os._exit(errorcode if 0 < errorcode < 256 else 1)

    def Dup(self) -> Comm:
        """The same ranks, with messages of their own (see ``_context``)."""
        self._dups += 1
        digest = hashlib.blake2b(f"{self._context}.{self._dups}".encode(), digest_size=7).digest()
        return type(self)(self._members, self._name, int.from_bytes(digest, "little") + 2)  # (COMM_SELF's: one rank)

    Clone = Dup

    def Free(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.Comm.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} "
                               "for the methods that are")

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Comm {self._name} (poprun-py)>"
