"""``MPI.Comm`` over the fabric: the communicator of a set of instances (``COMM_WORLD``: all of them).

As in mpi4py, lowercase methods take any picklable Python object (they travel pickled, as mpi4py's do,
between this job's instances only: see ``popdist.ragged``), and uppercase methods take buffers: a NumPy
array, or ``[array, MPI.FLOAT]``-style specs. Reductions run in rank order, so every rank gets the same
bits. Rooted operations (``Gather``, ``Reduce``, ``Scatter``) run as their all-to-all forms and keep the
root's part: simpler, and the same result.

Buffers are read and written as they lie in memory, as MPI's are: a C- or Fortran-contiguous array (a
non-contiguous one raises ``BufferError``, as in mpi4py), the first ``count`` items of a
``[buffer, count, datatype]`` spec, any object with the buffer protocol or DLPack's (a CPU torch tensor).

Point to point: ``send``/``recv`` (and ``Send``/``Recv``) are MPI's standard mode: ``send`` returns once
its message is on the way (the fabric's ``send``: eager while the link has room, so two ranks may both send
before they receive, and a ring of sends completes), and ``recv`` matches by tag, setting aside the
messages that came first with other tags. The source must be named (no ``ANY_SOURCE``). ``Recv`` takes a
message of at most its buffer's bytes, as MPI does.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Any, Callable, Sequence

import numpy as np

from popdist import core
from popdist.backend import current_fabric
from popdist.ragged import allgather_objects, broadcast_object

README_SECTION = "README \"Running Graphcore's programs\""


#: Messages received (or sent to ourselves) before a ``recv`` asked for them, by (communicator's context, source
#: instance), each (tag, bytes), in the order they came.
_unclaimed: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
os.register_at_fork(after_in_child=_unclaimed.clear)  # (a forked instance, ``launch()``'s, is not its parent)


#: mpi4py's error classes for what it raises as ``MPI.Exception`` here (Open MPI's values).
ERR_TAG, ERR_TRUNCATE = 4, 15
_ERROR_NAMES = {ERR_TAG: "MPI_ERR_TAG", ERR_TRUNCATE: "MPI_ERR_TRUNCATE"}


class MPIException(RuntimeError):
    """``MPI.Exception``: an error of an MPI call, with its error class (``error_code``), as mpi4py raises."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(f"{message} ({_ERROR_NAMES.get(error_code, error_code)})")
        self.error_code = error_code

    def Get_error_code(self) -> int:
        return self.error_code

    Get_error_class = Get_error_code

    def Get_error_string(self) -> str:
        return str(self)


class NotProvidedError(AttributeError, NotImplementedError):
    """A part of mpi4py's API that poprun-py does not provide (an AttributeError, so ``hasattr`` is False)."""


class Op:
    """A reduction: ``MPI.SUM`` etc. Callable on two Python objects, as mpi4py's are."""

    def __init__(self, name: str, fabric_op: str, combine: Callable[[Any, Any], Any]) -> None:
        self.name, self.fabric_op, self._combine = name, fabric_op, combine

    def __call__(self, x: Any, y: Any) -> Any:
        return self._combine(x, y)

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Op {self.name}>"

    @classmethod
    def Create(cls, function: Any, commute: bool = False) -> Op:
        raise NotProvidedError(f"MPI.Op.Create is not provided by poprun-py's mpi4py (user-defined reductions); "
                               f"use the lowercase allreduce with a Python function, see {README_SECTION}")


class Datatype:
    """An MPI datatype, as the NumPy dtype of a buffer spec such as ``[array, MPI.FLOAT]``."""

    def __init__(self, name: str, dtype: str) -> None:
        self.name, self.dtype = name, np.dtype(dtype)

    def Get_size(self) -> int:
        return self.dtype.itemsize

    size = property(Get_size)

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Datatype {self.name}>"


class _InPlace:
    def __repr__(self) -> str:
        return "<mpi4py.MPI.IN_PLACE>"


IN_PLACE = _InPlace()
ANY_SOURCE = -1
ANY_TAG = -1
UNDEFINED = -32766  # (Open MPI's value)


class Status:
    """Filled by ``recv(status=...)``: the source, tag and size in bytes of the message received."""

    def __init__(self) -> None:
        self.source, self.tag, self.error, self.nbytes = ANY_SOURCE, ANY_TAG, 0, 0

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error

    def Get_count(self, datatype: Datatype | None = None) -> int:
        """Items of ``datatype`` (bytes by default) in the message; ``UNDEFINED`` if they do not divide it."""
        size = 1 if datatype is None else datatype.Get_size()
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    source_ = property(Get_source)
    count = property(Get_count)


def _buffer(spec: Any, what: str, receives: bool = False) -> np.ndarray:
    """The memory of a buffer spec as a one-dimensional array, in memory order, sharing it: an array, or
    ``[buffer, datatype]`` / ``[buffer, count, datatype]``, or any object with the buffer protocol; one that
    ``receives`` must be writable (checked before anything moves, as mpi4py does)."""
    datatype, count = None, None
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise TypeError(f"{what}: an empty buffer spec")
        if len(spec) == 3 and isinstance(spec[1], (int, np.integer)) and not isinstance(spec[1], bool):
            count = int(spec[1])
        spec, datatype = spec[0], spec[-1] if isinstance(spec[-1], Datatype) else None
    if not isinstance(spec, np.ndarray) and hasattr(spec, "__dlpack__"):  # a torch tensor, as mpi4py 4 takes it
        try:
            spec = np.from_dlpack(spec)
        except (BufferError, TypeError, RuntimeError) as exc:
            raise BufferError(f"{what}: NumPy cannot share this {type(spec).__name__}'s memory ({exc}); a CPU "
                              "tensor of a NumPy dtype can (convert a bfloat16 one first)") from None
    if isinstance(spec, np.ndarray):
        if not (spec.flags.c_contiguous or spec.flags.f_contiguous):
            raise BufferError(f"{what}: the array is not contiguous in memory; MPI reads and writes a buffer as it lies "
                              "in memory, so mpi4py refuses it and so does poprun-py: pass "
                              "np.ascontiguousarray(...) and copy the result back")
        flat = spec.ravel(order="K")  # (a view: in memory order, C or Fortran)
        if datatype is not None and flat.dtype != datatype.dtype:
            flat = flat.view(np.uint8).view(datatype.dtype)
    else:
        try:
            view = memoryview(spec)
        except TypeError:
            raise TypeError(f"{what}: {type(spec).__name__} is not a buffer; pass a NumPy array (or use the "
                            f"lowercase method for Python objects)") from None
        flat = np.frombuffer(view, datatype.dtype if datatype else np.dtype(view.format or "B")).reshape(-1)
    if count is not None:
        if not 0 <= count <= flat.size:
            raise ValueError(f"{what}: count {count} is more than the buffer's {flat.size} items")
        flat = flat[:count]
    if receives and not flat.flags.writeable:
        raise BufferError(f"{what}: the receive buffer is read-only")
    return flat


def _into(recvbuf: np.ndarray, values: np.ndarray, what: str) -> None:
    """``values`` into ``recvbuf`` (``_buffer``'s view of the caller's memory), converting the dtype."""
    if recvbuf.size != values.size:
        raise ValueError(f"{what}: the receive buffer holds {recvbuf.size} elements, the result has {values.size}")
    np.copyto(recvbuf, values.reshape(-1), casting="unsafe")


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
        array = _buffer(buf, "Bcast", receives=self.Get_rank() != root)
        _into(array, current_fabric().broadcast(array, self._instance(root, "Bcast"), self._group()), "Bcast")

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        recv = _buffer(recvbuf, "Allreduce", receives=True)
        send = recv if sendbuf is IN_PLACE else _buffer(sendbuf, "Allreduce")
        _into(recv, current_fabric().allreduce(send, (op or SUM).fabric_op, self._group()), "Allreduce")

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None, root: int = 0) -> None:
        is_root = self.Get_rank() == root
        recv = _buffer(recvbuf, "Reduce", receives=True) if is_root else None
        if sendbuf is IN_PLACE:
            if recv is None:
                raise ValueError("Reduce: only the root may pass MPI.IN_PLACE")
            send = recv
        else:
            send = _buffer(sendbuf, "Reduce")
        result = current_fabric().allreduce(send, (op or SUM).fabric_op, self._group())
        if recv is not None:
            _into(recv, result, "Reduce")

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        recv = _buffer(recvbuf, "Allgather", receives=True)
        send = self._own_block(recv, "Allgather") if sendbuf is IN_PLACE else _buffer(sendbuf, "Allgather")
        _into(recv, current_fabric().allgather(send, self._group()), "Allgather")

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        is_root = self.Get_rank() == self._rank_checked(root, "Gather")
        recv = _buffer(recvbuf, "Gather", receives=True) if is_root else None
        if sendbuf is IN_PLACE:
            if recv is None:
                raise ValueError("Gather: only the root may pass MPI.IN_PLACE")
            send = self._own_block(recv, "Gather")
        else:
            send = _buffer(sendbuf, "Gather")
        gathered = current_fabric().allgather(send, self._group())
        if recv is not None:
            _into(recv, gathered, "Gather")

    def _own_block(self, recv: np.ndarray, what: str) -> np.ndarray:
        """With ``MPI.IN_PLACE``: this rank's block of the receive buffer, where MPI takes its contribution from."""
        size = self.Get_size()
        if recv.size % size:
            raise ValueError(f"{what}: the receive buffer's {recv.size} items do not split into {size} ranks' blocks")
        block = recv.size // size
        return recv[self.Get_rank() * block:(self.Get_rank() + 1) * block].copy()

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        recv = _buffer(recvbuf, "Scatter", receives=True)
        shape = (self.Get_size(), *recv.shape)
        if self.Get_rank() == self._rank_checked(root, "Scatter"):
            send = _buffer(sendbuf, "Scatter")
            if send.size != recv.size * self.Get_size():
                raise ValueError(f"Scatter: the root's buffer holds {send.size} elements, "
                                 f"{self.Get_size()} ranks x {recv.size} are needed")
            send = np.ascontiguousarray(send, dtype=recv.dtype).reshape(shape)
        else:
            send = np.empty(shape, recv.dtype)
        everything = current_fabric().broadcast(send, self._instance(root, "Scatter"), self._group())
        _into(recv, everything[self.Get_rank()], "Scatter")

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """``send``'s standard mode, of the buffer's bytes."""
        self._send_bytes(_buffer(buf, "Send").view(np.uint8), dest, tag, "Send")

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        """The message's bytes into the start of ``buf``, which must have room for them (MPI_ERR_TRUNCATE)."""
        room = _buffer(buf, "Recv", receives=True).view(np.uint8)
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


SUM = Op("SUM", "sum", lambda x, y: x + y)
PROD = Op("PROD", "prod", lambda x, y: x * y)
MAX = Op("MAX", "max", lambda x, y: np.maximum(x, y) if isinstance(x, np.ndarray) else max(x, y))
MIN = Op("MIN", "min", lambda x, y: np.minimum(x, y) if isinstance(x, np.ndarray) else min(x, y))
