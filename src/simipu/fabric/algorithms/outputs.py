"""A caller's ``out=`` array for broadcast and allgather: checked as NumPy checks one, before it is written.

A collective that fills the caller's array (as mpi4py's ``comm.Bcast(x)`` and
``comm.Allgather(x, out)`` do) skips a fresh result per call, which above
glibc's mmap threshold is a fresh set of page faults on every call.

A bad ``out`` is a mistake of one instance, which cannot know whether its
peers made it too; so the engine never raises before the call (the peers
would wait for it forever: a late peer is not an error). It checks ``out``
first, writes nothing into a bad one, runs the collective into a result of
its own like every other member, and raises the ``ValueError`` after: the
peers finish their call, and the fabric stays usable.
"""

from __future__ import annotations

import numpy as np


def out_problem(out: object, shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    """Why ``out`` cannot take a result of ``shape`` and ``dtype`` (a one-line message), or None if it can."""
    if type(out) is not np.ndarray and not isinstance(out, np.ndarray):
        return f"out must be a NumPy array, got {type(out).__name__}"
    if out.shape != shape or out.dtype != dtype:
        if out.shape == shape and not out.dtype.isnative and out.dtype.newbyteorder("=") == dtype:
            return (f"out is {out.dtype.str}{list(out.shape)}, not in this machine's byte order, and results are "
                    f"written in it ({dtype}); for out= (in place too) pass a native-order array "
                    "(x.astype(x.dtype.newbyteorder('='))), or no out")
        return (f"out is {out.dtype}{list(out.shape)} but the result is {dtype}{list(shape)}; "
                "pass an array of the result's dtype and shape, or no out")
    if not out.flags.c_contiguous or not out.flags.writeable:
        return "out must be a writeable C-contiguous array (np.ascontiguousarray makes one)"
    return None


def result_for(out: np.ndarray | None, x: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, str | None]:
    """The array a call fills (``out`` if it is fit, else a new one), ``x`` (a copy if ``out`` overlaps it
    without being it: ``out`` is written while ``x`` is read), and why ``out`` is unfit (None if it is)."""
    bad = None if out is None else out_problem(out, shape, x.dtype)
    if out is None or bad:
        return np.empty(shape, dtype=x.dtype), x, bad
    return out, x.copy() if out is not x and np.may_share_memory(out, x) else x, None
