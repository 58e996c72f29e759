"""Collectives on data whose size differs between instances: byte strings, Python objects, and arrays whose
first dimension differs (Horovod's allgather, mpi4py's lowercase methods).

The fabric moves arrays of one shape on every member; these first exchange a small fixed-size header (the
length, or the shape and dtype), then the payload padded to the largest. Every member sees every header, so
a disagreement (other trailing dimensions, another dtype) raises the same ``ValueError`` on every member and
never leaves one waiting.

Objects travel pickled, as in mpi4py's lowercase API and Horovod's ``broadcast_object``. Unpickling runs
code chosen by the sender, so it is only acceptable from a sender you trust: here the bytes come only from
the other instances of this job, over the job's fabric, whose every connection answered the launcher's
per-job HMAC challenge before it carried a frame (README "Collectives"). Nothing else can reach these
calls; never feed them bytes from anywhere else.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Sequence

import numpy as np

from popdist.backend import current_fabric, current_group
from simipu.fabric.errors import CollectiveMismatchError
from simipu.fabric.frames.header import ALLGATHER, name_call


class RowsMismatchError(CollectiveMismatchError, ValueError):
    """Members gathered arrays whose dtypes or trailing dimensions differ: a mismatched collective (a
    RuntimeError, as Horovod's allgather raises) and a ValueError (as this module raised before)."""

__all__ = ["allgather_bytes", "allgather_objects", "allgather_rows", "broadcast_bytes", "broadcast_object"]

#: Most dimensions an array may have in ``allgather_rows`` (the header has room for this many).
MAX_DIMS = 16
# (a mismatch that meets this header names what it begins, not only "allgather on int64[18]")
name_call(ALLGATHER, np.dtype(np.int64), (2 + MAX_DIMS,), "the exchange of shapes that begins an allgather of "
          "rows or of Python objects: hvd.allgather, allgather_object, mpi4py's lowercase collectives")


def _group(group: Sequence[int] | None) -> Sequence[int] | None:
    return current_group() if group is None else group


def broadcast_bytes(data: bytes | None, root: int, group: Sequence[int] | None = None) -> bytes:
    """The root's ``data`` on every member (the others pass None): its length first, then the bytes."""
    fabric = current_fabric()
    members = _group(group)
    mine = fabric.instance == root
    if mine and data is None:
        raise ValueError("the root of a broadcast must give the data")
    length = fabric.broadcast(np.array([len(data) if mine else 0], np.int64), root, members)  # type: ignore[arg-type]
    count = int(length[0])
    if count == 0:
        return b""
    payload = np.frombuffer(data, np.uint8) if mine else np.empty(count, np.uint8)  # type: ignore[arg-type]
    return fabric.broadcast(payload, root, members).tobytes()


def allgather_bytes(data: bytes, group: Sequence[int] | None = None) -> list[bytes]:
    """Every member's ``data``, in member order (lengths may differ)."""
    fabric = current_fabric()
    members = _group(group)
    lengths = fabric.allgather(np.array([len(data)], np.int64), members)[:, 0]
    longest = int(lengths.max())
    if longest == 0:
        return [b""] * len(lengths)
    padded = np.zeros(longest, np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    rows = fabric.allgather(padded, members)
    return [rows[k, :int(n)].tobytes() for k, n in enumerate(lengths)]


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def broadcast_object(obj: Any, root: int, group: Sequence[int] | None = None,
                     dumps: Callable[[Any], bytes] = _pickled, copied: bool = False) -> Any:
    """The root's ``obj`` on every member, pickled by ``dumps`` (see the module docstring for why unpickling is
    safe here); the root gets ``obj`` itself, or with ``copied`` a copy of it, as mpi4py's ``bcast`` does."""
    fabric = current_fabric()
    data = dumps(obj) if fabric.instance == root else None
    received = broadcast_bytes(data, root, group)
    return obj if fabric.instance == root and not copied else pickle.loads(received)  # noqa: S301 - the job's own


def allgather_objects(obj: Any, group: Sequence[int] | None = None,
                      dumps: Callable[[Any], bytes] = _pickled, copied: bool = False) -> list[Any]:
    """Every member's ``obj``, pickled by ``dumps``, in member order (this member's own object is not copied
    unless ``copied``: mpi4py's ``allgather`` copies it, so a result never aliases the caller's object)."""
    fabric = current_fabric()
    members = _group(group)
    blobs = allgather_bytes(dumps(obj), members)
    mine = -1 if copied else (list(members).index(fabric.instance) if members else fabric.instance)
    return [obj if k == mine else pickle.loads(blob) for k, blob in enumerate(blobs)]  # noqa: S301


def allgather_rows(array: np.ndarray, group: Sequence[int] | None = None) -> list[np.ndarray]:
    """Every member's array, in member order; the first dimension may differ, nothing else may."""
    fabric = current_fabric()
    members = _group(group)
    x = np.asarray(array)  # (not ascontiguousarray yet: it makes a 0-d array 1-d)
    if x.ndim > MAX_DIMS:
        raise ValueError(f"allgather takes arrays of at most {MAX_DIMS} dimensions, got {x.ndim}")
    header = np.zeros(2 + MAX_DIMS, np.int64)
    header[0], header[1], header[2:2 + x.ndim] = x.dtype.num, x.ndim, x.shape
    headers = fabric.allgather(header, members)  # (a 0-d array's too: every member then refuses it alike)
    _check_same_rows(headers, x)
    x = np.ascontiguousarray(x)
    rows = [int(h[2]) for h in headers]
    if len(set(rows)) == 1:
        gathered = fabric.allgather(x, members)
        return list(gathered)
    padded = np.zeros((max(rows), *x.shape[1:]), x.dtype)
    padded[:x.shape[0]] = x
    gathered = fabric.allgather(padded, members)
    return [gathered[k, :n] for k, n in enumerate(rows)]


def _check_same_rows(headers: np.ndarray, x: np.ndarray) -> None:
    """Every member's dtype and trailing dimensions agree with the first member's, and none is 0-d (the same
    verdict on all)."""
    flat = [k for k, header in enumerate(headers) if header[1] == 0]
    if flat:
        raise RowsMismatchError(f"allgather: members {flat} pass a 0-d array (a rank-zero tensor, which Horovod's "
                                "allgather refuses too), and it concatenates on the first dimension: give every "
                                "member's at least one dimension (x.reshape(1))")
    first = headers[0]
    for k, header in enumerate(headers):
        if header[0] != first[0]:
            raise RowsMismatchError(f"allgather: members 0 and {k} pass different dtypes "
                             f"({np.dtype(_dtype_of(first[0]))} and {np.dtype(_dtype_of(header[0]))})")
        if header[1] != first[1] or not np.array_equal(header[3:], first[3:]):
            shapes = [tuple(int(d) for d in h[2:2 + int(h[1])]) for h in (first, header)]
            raise RowsMismatchError(f"allgather: members 0 and {k} pass shapes {shapes[0]} and {shapes[1]}; "
                             "only the first dimension may differ")


def _dtype_of(num: int) -> np.dtype:
    for code in np.typecodes["All"]:
        try:
            dtype = np.dtype(code)
        except TypeError:
            continue
        if dtype.num == num:
            return dtype
    return np.dtype(np.uint8)
