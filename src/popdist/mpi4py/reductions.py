"""mpi4py's reduction operations: ``MPI.SUM``, ``PROD``, ``MAX``, ``MIN``, the logical and bitwise ones
(``LAND``, ``LOR``, ``LXOR``, ``BAND``, ``BOR``, ``BXOR``), ``MAXLOC`` and ``MINLOC``, ``REPLACE`` and
``NO_OP``, and the user's own, ``MPI.Op.Create(function, commute)``.

On Python objects (the lowercase calls) an operation combines two objects, as mpi4py's ``Op.__call__`` does
(a user's function is called as ``function(x, y, None)`` and returns the result). On buffers, the four
arithmetic ones are the fabric's own reduction (``fabric_op``); the others reduce every rank's buffer here, in
rank order (``reduce_arrays``), so every rank gets the same bits, as from the fabric. A user's function is
called as MPI calls it, ``function(inbuf, inoutbuf, datatype)``, with the lower ranks' part as ``inbuf`` and
the next rank's as ``inoutbuf``, which it overwrites. Which types each takes on buffers is Open MPI's:
``SUM`` and ``PROD`` numbers, ``MAX`` and ``MIN`` numbers that are not complex, the logical ones integers and
booleans, the bitwise ones integers, ``MAXLOC`` and ``MINLOC`` the (value, index) pair types
(``MPI.DOUBLE_INT``...); anything else raises ``MPI.Exception`` with ``MPI.ERR_OP``, as there.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from popdist.mpi4py.specs import (
    ERR_OP,
    Datatype,
    MPIException,
    buffer_of,
    datatype_for,
    fill,
    same_datatype,
    spec_datatype,
)
from simipu.fabric.errors import CollectiveMismatchError

#: Combines two Python objects (the lowercase calls).
Combine = Callable[[Any, Any], Any]
#: Reduces two arrays of the same dtype and size, the lower rank's first, into a new array.
ArrayReduce = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Op:
    """A reduction (module docstring). Unhashable and compared by handle, as mpi4py's: ``MPI.Op(op)`` is
    another handle to ``op``, and a freed one equals ``MPI.OP_NULL``."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, op: Op | None = None) -> None:
        """``MPI.Op()``: a null operation; ``MPI.Op(op)``: another handle to ``op``, as mpi4py's."""
        if op is None:
            self._define("OP_NULL", None)
        else:
            self.__dict__.update(op.__dict__)

    def _define(self, name: str, combine: Combine | None, *, fabric_op: str | None = None,
                arrays: ArrayReduce | None = None, takes: Callable[[np.dtype], bool] | None = None,
                user: Callable[[Any, Any, Any], Any] | None = None, commute: bool = True) -> Op:
        self.name, self.fabric_op = name, fabric_op
        self._combine, self._arrays, self._takes, self._user = combine, arrays, takes, user
        self._commute = commute
        #: What equality compares (None: null, ``OP_NULL`` or a user's operation once freed).
        self._handle: object | None = None if combine is None else object()
        return self

    @classmethod
    def predefined(cls, name: str, combine: Combine | None, **how: Any) -> Op:
        """One of MPI's operations (``_define``'s arguments)."""
        return cls.__new__(cls)._define(name, combine, **how)

    # -- what mpi4py's Op answers ---------------------------------------------------------------------------
    @classmethod
    def Create(cls, function: Callable[[Any, Any, Any], Any], commute: bool = False) -> Op:
        """A user-defined operation: ``function(inbuf, inoutbuf, datatype)`` writes ``inbuf op inoutbuf`` into
        ``inoutbuf`` (buffers), or returns ``x op y`` when called with ``(x, y, None)`` (Python objects).
        Reductions run in rank order whether or not it commutes."""
        if not callable(function):
            raise TypeError(f"Op.Create: {function!r} is not callable; pass function(inbuf, inoutbuf, datatype)")
        name = getattr(function, "__name__", "user")
        return cls.__new__(cls)._define(f"user {name}", lambda x, y: function(x, y, None), user=function,
                                        commute=bool(commute))

    def Is_commutative(self) -> bool:
        self.check_usable("Is_commutative")
        return self._commute

    def Free(self) -> None:
        """A user's operation becomes ``MPI.OP_NULL``; a predefined or null one cannot be freed (``MPI.ERR_OP``)."""
        self.check_usable("Op.Free")
        if self._user is None:
            raise MPIException(ERR_OP, f"Op.Free: {self!r} is predefined; only an operation made by Op.Create "
                                       "can be freed")
        self._handle = None

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:
        """``inoutbuf = inbuf op inoutbuf``, on this rank alone."""
        inout = buffer_of(inoutbuf, "Reduce_local", receives=True)
        source = buffer_of(inbuf, "Reduce_local")
        same_datatype(source, inout, "Reduce_local")
        if source.size != inout.size:
            raise ValueError(f"Reduce_local: mismatch in send count {source.size} and receive count {inout.size}")
        fill(inout, self.reduce_arrays([source, inout.copy()], "Reduce_local", spec_datatype(inoutbuf)),
             "Reduce_local")

    @property
    def is_commutative(self) -> bool:
        return self.Is_commutative()

    @property
    def is_predefined(self) -> bool:
        return self._user is None or self._handle is None

    def __bool__(self) -> bool:
        return self._handle is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self._handle is other._handle

    def __repr__(self) -> str:
        return "<mpi4py.MPI.Op OP_NULL>" if self._handle is None else f"<mpi4py.MPI.Op {self.name}>"

    # -- reducing -------------------------------------------------------------------------------------------
    def __call__(self, x: Any, y: Any) -> Any:
        """``x op y`` on two Python objects (x from the lower rank)."""
        self.check_callable()
        return self._combine(x, y)  # type: ignore[misc]

    def check_callable(self) -> None:
        """A null operation on Python objects raises ``ValueError``, as mpi4py's."""
        if self._handle is None:
            raise ValueError("cannot call a null operation: MPI.OP_NULL, or an Op.Create operation that was freed")

    def check_buffer(self, dtype: np.dtype, what: str) -> None:
        """Raise ``MPI.Exception`` (``MPI.ERR_OP``) if this operation does not reduce buffers of ``dtype``; before
        anything moves, so that every rank raises alike."""
        self.check_usable(what)
        if self._user is None and (self._takes is None or not self._takes(dtype)):
            hint = (" (it reduces (value, index) pairs: give the buffer with MPI.DOUBLE_INT, FLOAT_INT, TWOINT, "
                    "LONG_INT or SHORT_INT)" if self.name in ("MAXLOC", "MINLOC") else "")
            raise MPIException(ERR_OP, f"{what}: MPI.{self.name} does not reduce a buffer of {dtype}{hint}: "
                                       "invalid reduce operation")

    def reduce_arrays(self, arrays: Sequence[np.ndarray], what: str, datatype: Datatype | None = None) -> np.ndarray:
        """Every rank's array (of one dtype and size), in rank order, reduced: a new array, or the only one.
        ``datatype`` is what a user's function is told (else the one mpi4py infers from the dtype); it is not
        called for empty buffers, as Open MPI does not call it for a count of 0."""
        self.check_buffer(arrays[0].dtype, what)
        if arrays[0].size == 0 or len(arrays) == 1:
            return arrays[0]
        if self._user is not None:
            return _fold_user(self._user, arrays, datatype or datatype_for(arrays[0].dtype))
        reduce = self._arrays or self._combine
        return functools.reduce(reduce, arrays)  # type: ignore[arg-type]

    def check_usable(self, what: str) -> None:
        if self._handle is None:
            raise MPIException(ERR_OP, f"{what}: the operation is MPI.OP_NULL (an Op.Create operation that was "
                                       "freed?): invalid reduce operation")


def reduction(op: Any, what: str) -> Op:
    """A buffer call's ``op`` argument as an operation (None: ``MPI.SUM``)."""
    if op is None:
        return SUM
    if not isinstance(op, Op):
        raise TypeError(f"{what}: op {op!r} is not an MPI.Op: pass MPI.SUM, MPI.MAX, ... or "
                        "MPI.Op.Create(function)")
    op.check_usable(what)
    return op


def combiner(op: Any, what: str) -> Callable[[Any, Any], Any]:
    """A lowercase call's ``op`` argument as a function of two objects (None: ``MPI.SUM``; a plain Python
    function of two objects is taken as it is)."""
    if op is None:
        return SUM
    if isinstance(op, Op):
        op.check_callable()
    elif not callable(op):
        raise TypeError(f"{what}: op {op!r} is not an MPI.Op: pass MPI.SUM, MPI.MAX, ... or "
                        "MPI.Op.Create(function)")
    return op


def op_name(op: Any) -> str:
    """How ranks name a lowercase call's ``op`` to each other (``alike``): MPI's operations by name, a function
    by its qualified name."""
    if op is None:
        return "SUM"
    return op.name if isinstance(op, Op) else str(getattr(op, "__qualname__", "a function"))


def alike(allgather: Callable[[Any], list[Any]], what: str, sendobj: Any, **call: Any) -> list[Any]:
    """Every rank's ``sendobj`` in rank order (``allgather``, the communicator's), once every rank named the same
    ``call`` (its op, its root): otherwise ``CollectiveMismatchError`` on every rank, as the buffer methods
    raise (each rank reduced with its own op or root before, silently giving each its own answer)."""
    pairs = allgather((call, sendobj))
    calls = [named for named, _ in pairs]
    if any(named != calls[0] for named in calls):
        ranks = ", ".join(f"rank {k} {' '.join(f'{key}={value}' for key, value in named.items())}"
                          for k, named in enumerate(calls))
        raise CollectiveMismatchError(f"{what}: the ranks called it differently ({ranks}); every rank must "
                                      "name the same op and root")
    return [obj for _, obj in pairs]


def _fold_user(function: Callable[[Any, Any, Any], Any], arrays: Sequence[np.ndarray],
               datatype: Datatype) -> np.ndarray:
    """Left to right, as MPI's ``inoutbuf = inbuf op inoutbuf``: the function writes each next rank's copy. Both
    buffers it gets are writable copies, as MPI's ``invec`` may be used as scratch."""
    result = np.array(arrays[0], copy=True)
    for higher in arrays[1:]:
        inout = np.array(higher, copy=True)
        function(result.view(np.uint8).data, inout.view(np.uint8).data, datatype)
        result = inout
    return result


# -- the predefined operations --------------------------------------------------------------------------------
def _kinds(kinds: str) -> Callable[[np.dtype], bool]:
    """Takes the dtypes of these NumPy kinds ("i" signed integers, "u" unsigned, "b" bool, "f" float, "c" complex)."""
    return lambda dtype: dtype.kind in kinds


def _pairs(dtype: np.dtype) -> bool:
    return dtype.names is not None and len(dtype.names) == 2


def _logical(function: Callable[..., np.ndarray]) -> ArrayReduce:
    """A logical ufunc as MPI's: 0 or 1 in the buffer's own type."""
    return lambda a, b: function(a, b).astype(a.dtype, copy=False)


def _loc(beats: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> ArrayReduce:
    """MAXLOC's or MINLOC's reduction of (value, index) pairs, as Open MPI's: the higher rank's pair unless the
    lower rank's value ``beats`` it; where the values are equal, the lower index (so a NaN is kept as Open MPI
    keeps it)."""
    def reduce(lower: np.ndarray, higher: np.ndarray) -> np.ndarray:
        value, index = lower.dtype.names  # type: ignore[misc]
        u, v = lower[value], higher[value]
        result = higher.copy()
        take = beats(u, v)
        result[take] = lower[take]
        tie = u == v
        result[index][tie] = np.minimum(lower[index], higher[index])[tie]
        return result
    return reduce


def _loc_objects(beats: Callable[[Any, Any], bool]) -> Combine:
    """MAXLOC's or MINLOC's combination of two (value, index) pairs, as Python objects (mpi4py's)."""
    def combine(x: Any, y: Any) -> tuple[Any, Any]:
        (u, i), (v, j) = x, y
        if beats(u, v):
            return u, i
        if beats(v, u) or j < i:
            return v, j
        return u, i
    return combine


def _max(x: Any, y: Any) -> Any:
    return np.maximum(x, y) if isinstance(x, np.ndarray) else max(x, y)


def _min(x: Any, y: Any) -> Any:
    return np.minimum(x, y) if isinstance(x, np.ndarray) else min(x, y)


SUM = Op.predefined("SUM", lambda x, y: x + y, fabric_op="sum", takes=_kinds("iufc"))
PROD = Op.predefined("PROD", lambda x, y: x * y, fabric_op="prod", takes=_kinds("iufc"))
MAX = Op.predefined("MAX", _max, fabric_op="max", takes=_kinds("iuf"))
MIN = Op.predefined("MIN", _min, fabric_op="min", takes=_kinds("iuf"))
LAND = Op.predefined("LAND", lambda x, y: bool(x) and bool(y), arrays=_logical(np.logical_and),
                     takes=_kinds("iub"))
LOR = Op.predefined("LOR", lambda x, y: bool(x) or bool(y), arrays=_logical(np.logical_or),
                    takes=_kinds("iub"))
LXOR = Op.predefined("LXOR", lambda x, y: bool(x) != bool(y), arrays=_logical(np.logical_xor),
                     takes=_kinds("iub"))
BAND = Op.predefined("BAND", lambda x, y: x & y, arrays=np.bitwise_and, takes=_kinds("iu"))
BOR = Op.predefined("BOR", lambda x, y: x | y, arrays=np.bitwise_or, takes=_kinds("iu"))
BXOR = Op.predefined("BXOR", lambda x, y: x ^ y, arrays=np.bitwise_xor, takes=_kinds("iu"))
MAXLOC = Op.predefined("MAXLOC", _loc_objects(lambda u, v: u > v), arrays=_loc(np.greater), takes=_pairs)
MINLOC = Op.predefined("MINLOC", _loc_objects(lambda u, v: u < v), arrays=_loc(np.less), takes=_pairs)
#: One-sided operations in MPI; on Python objects, mpi4py's: the later object, the earlier one.
REPLACE = Op.predefined("REPLACE", lambda x, y: y)
NO_OP = Op.predefined("NO_OP", lambda x, y: x)
OP_NULL = Op()
