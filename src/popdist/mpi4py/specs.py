"""What mpi4py's calls take and give besides communicators: reductions, datatypes, buffer specs (read and
written as they lie in memory, as MPI's are), ``IN_PLACE``, ``Status``, and the errors.

A buffer is a C- or Fortran-contiguous array (a non-contiguous one raises ``BufferError``, as in mpi4py),
or any object with the buffer protocol or DLPack's (a CPU torch tensor). A buffer spec is a buffer, or a list
of it with a count, a displacement and a datatype in mpi4py's forms (``spec_parts``); ``buffer_of`` makes it
a one-dimensional view.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np

README_SECTION = "README \"Running Graphcore's programs\""

#: MPI's error classes, as ``MPI.Exception`` carries them (Open MPI's values, which mpi4py gives there).
SUCCESS, ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_COMM, ERR_RANK, ERR_REQUEST, ERR_ROOT, ERR_GROUP = range(10)
ERR_OP, ERR_TOPOLOGY, ERR_DIMS, ERR_ARG, ERR_UNKNOWN, ERR_TRUNCATE, ERR_OTHER, ERR_INTERN, ERR_IN_STATUS, \
    ERR_PENDING = range(10, 20)
#: Each class's name and what it means (``MPI.Get_error_string``).
_ERRORS = {SUCCESS: ("MPI_SUCCESS", "no error"), ERR_BUFFER: ("MPI_ERR_BUFFER", "invalid buffer"),
           ERR_COUNT: ("MPI_ERR_COUNT", "invalid count"), ERR_TYPE: ("MPI_ERR_TYPE", "invalid datatype"),
           ERR_TAG: ("MPI_ERR_TAG", "invalid tag"), ERR_COMM: ("MPI_ERR_COMM", "invalid communicator"),
           ERR_RANK: ("MPI_ERR_RANK", "invalid rank"), ERR_REQUEST: ("MPI_ERR_REQUEST", "invalid request"),
           ERR_ROOT: ("MPI_ERR_ROOT", "invalid root"), ERR_GROUP: ("MPI_ERR_GROUP", "invalid group"),
           ERR_OP: ("MPI_ERR_OP", "invalid reduction operation"),
           ERR_TOPOLOGY: ("MPI_ERR_TOPOLOGY", "invalid topology"), ERR_DIMS: ("MPI_ERR_DIMS", "invalid dimensions"),
           ERR_ARG: ("MPI_ERR_ARG", "invalid argument"), ERR_UNKNOWN: ("MPI_ERR_UNKNOWN", "unknown error"),
           ERR_TRUNCATE: ("MPI_ERR_TRUNCATE", "message truncated"), ERR_OTHER: ("MPI_ERR_OTHER", "other error"),
           ERR_INTERN: ("MPI_ERR_INTERN", "internal error"), ERR_IN_STATUS: ("MPI_ERR_IN_STATUS", "error in a status"),
           ERR_PENDING: ("MPI_ERR_PENDING", "request pending")}


def error_string(code: int) -> str:
    """What an error class means, named as MPI names it (``MPI.Get_error_string``)."""
    name, meaning = _ERRORS.get(code, (f"MPI error {code}", "not an error class MPI defines"))
    return f"{name}: {meaning}"


def is_int(value: Any) -> bool:
    """An int as MPI's arguments take one (a NumPy integer too, a bool not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@functools.total_ordering
class MPIException(RuntimeError):
    """``MPI.Exception``: an error of an MPI call, as mpi4py raises it: it is its error class where an int is
    (``exc == MPI.ERR_RANK``, ``int(exc)``, a dict key), false for ``MPI.SUCCESS``, and ``MPI.Exception(code)``
    makes one. poprun-py's own add a ``message`` saying what went wrong: ``"<message> (MPI_ERR_RANK)"``."""

    def __init__(self, ierr: int = SUCCESS, message: str | None = None) -> None:
        if not is_int(ierr):
            raise TypeError(f"MPI.Exception: an error class is an int (MPI.ERR_ARG...), not {ierr!r}")
        self._code, self._message = int(ierr), message
        name = _ERRORS.get(self._code, (f"MPI error {self._code}",))[0]
        super().__init__(error_string(self._code) if message is None else f"{message} ({name})")

    def Get_error_code(self) -> int:
        return self._code

    def Get_error_class(self) -> int:
        return self._code  # (every code here is a class)

    def Get_error_string(self) -> str:
        return error_string(self._code)

    error_code = property(Get_error_code)
    error_class = property(Get_error_class)
    error_string = property(Get_error_string)

    def __int__(self) -> int:
        return self._code

    def __bool__(self) -> bool:
        return self._code != SUCCESS

    def __hash__(self) -> int:
        return hash(self._code)

    def __eq__(self, other: object) -> bool:
        return operator.eq(self._code, other)

    def __lt__(self, other: Any) -> bool:  # (``functools.total_ordering`` derives <=, > and >=)
        return operator.lt(self._code, other)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its class, code and message (its ``args`` are its text, which no constructor takes)."""
        return _exception_of, (type(self), self._code, self._message)


def _exception_of(kind: type[MPIException], code: int, message: str | None) -> MPIException:
    made = kind.__new__(kind)
    MPIException.__init__(made, code, message)
    return made


class RankError(MPIException, ValueError):
    """A rank that is not in the communicator: ``MPI.Exception`` with ``ERR_RANK``, as mpi4py raises (and a
    ValueError, as poprun-py raised before it had the class)."""

    def __init__(self, message: str) -> None:
        super().__init__(ERR_RANK, message)


class RootError(RankError):
    """A collective's root that is not a rank of the communicator: ``MPI.Exception`` with ``ERR_ROOT``, as Open
    MPI raises (a ``RankError``, as poprun-py raised before)."""

    def __init__(self, message: str) -> None:
        MPIException.__init__(self, ERR_ROOT, message)


class NotProvidedError(AttributeError, NotImplementedError):
    """A part of mpi4py's API that poprun-py does not provide (an AttributeError, so ``hasattr`` is False)."""


class NamesWhatIsNotProvided(type):
    """The metaclass of a class of mpi4py's (``MPI.Comm``, ``MPI.Request``) whose missing class attributes raise
    ``NotProvidedError`` pointing to the README, as its instances' missing attributes do: ``MPI.Comm.Compare``
    as ``comm.Compare``."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.{cls.__name__}.{name} is not provided by poprun-py's mpi4py; see "
                               f"{README_SECTION} for the methods that are")


class Datatype(metaclass=NamesWhatIsNotProvided):
    """An MPI datatype, as the NumPy dtype of a buffer spec such as ``[array, MPI.FLOAT]``; the (value, index)
    pair types are structured dtypes laid out as C lays out MPI's (``MPI.DOUBLE_INT``: 12 bytes in 16).
    Derived datatypes (``Create_vector``, ``Commit``...) are not provided: they raise ``NotProvidedError``."""

    def __init__(self, name: str, dtype: Any, size: int | None = None, *, inferred: bool = False,
                 typechar: str | None = None) -> None:
        """``name``: MPI's (``"MPI_DOUBLE"``); ``inferred``: the one mpi4py gives a buffer of this dtype that
        names no datatype (``datatype_for``); ``typechar``: mpi4py's where it is not the dtype's."""
        self.name, self.dtype = name, np.dtype(dtype)
        self._size = self.dtype.itemsize if size is None else size
        self.typechar = self.dtype.char if typechar is None else typechar
        if inferred:
            _INFERRED.setdefault(self.dtype, self)

    def Get_name(self) -> str:
        return self.name

    def Get_size(self) -> int:
        return self._size

    def Get_extent(self) -> tuple[int, int]:
        """(lower bound, extent): where an item starts and how far apart items lie."""
        return 0, self.dtype.itemsize

    size = property(Get_size)

    @property
    def extent(self) -> int:
        return self.dtype.itemsize

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Datatype {self.name}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.Datatype.{name} is not provided by poprun-py's mpi4py (only the predefined "
                               f"datatypes are); see {README_SECTION} for what is")


_INFERRED: dict[np.dtype, Datatype] = {}


def datatype_for(dtype: np.dtype) -> Datatype:
    """The datatype mpi4py gives a buffer of ``dtype`` (``MPI.INT`` for int32...), or one named by it."""
    found = _INFERRED.get(dtype)
    return found if found is not None else Datatype(dtype.str, dtype)


class _InPlace:
    def __repr__(self) -> str:
        return "<mpi4py.MPI.IN_PLACE>"


IN_PLACE = _InPlace()


def in_place(buffer: Any) -> bool:
    """Whether a collective's buffer argument says "in place": ``MPI.IN_PLACE``, or None, as mpi4py reads it."""
    return buffer is None or buffer is IN_PLACE
ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2  # (Open MPI's values: a send to it does nothing, a receive from it gets nothing at once)
UNDEFINED = -32766  # (Open MPI's value)
#: ``Comm.Split_type``'s one split: the ranks that share a host (Open MPI's value).
COMM_TYPE_SHARED = 0


class Status(metaclass=NamesWhatIsNotProvided):
    """Filled by ``recv(status=...)``: the source, tag and size in bytes of the message received."""

    def __init__(self, status: Status | None = None) -> None:
        """An empty status, or a copy of ``status`` (as mpi4py's ``Status(status)``)."""
        self.source, self.tag, self.error, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, 0, False
        if status is not None:
            self.source, self.tag, self.error, self.nbytes = status.source, status.tag, status.error, status.nbytes
            self.cancelled = status.cancelled

    def Get_source(self) -> int:
        return self.source

    def Set_source(self, source: int) -> None:
        self.source = source

    def Get_tag(self) -> int:
        return self.tag

    def Set_tag(self, tag: int) -> None:
        self.tag = tag

    def Get_error(self) -> int:
        return self.error

    def Set_error(self, error: int) -> None:
        self.error = error

    def Get_count(self, datatype: Datatype | None = None) -> int:
        """Items of ``datatype`` (bytes by default) in the message; ``UNDEFINED`` if they do not divide it."""
        size = 1 if datatype is None else datatype.Get_size()
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype: Datatype | None, count: int) -> None:
        """Say the message held ``count`` items of ``datatype`` (bytes if None)."""
        self.nbytes = count * (1 if datatype is None else datatype.Get_size())

    def Is_cancelled(self) -> bool:
        return self.cancelled  # (never, unless set: no request here can be cancelled)

    def Set_cancelled(self, flag: bool) -> None:
        self.cancelled = bool(flag)

    source_ = property(Get_source)
    count = property(Get_count)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.Status.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} "
                               "for what is")


#: A status's source, tag and byte count when it says nothing (MPI's empty status).
EMPTY_STATUS = (ANY_SOURCE, ANY_TAG, 0)


def fill_status(status: Status | None, fields: tuple[int, int, int]) -> None:
    """Say in ``status``, if one is given, what a receive took: (source rank, tag, bytes); no error."""
    if status is not None:
        status.source, status.tag, status.nbytes = fields
        status.error = 0


def spec_parts(spec: Any, what: str,
               pairs: tuple[type, ...] = (tuple, list)) -> tuple[Any, Any, Any, Datatype | None]:
    """A buffer spec's buffer, count, displacement and datatype (None where it gives none), read as mpi4py reads
    its forms: a buffer, ``[buffer, datatype]``, ``[buffer, count]``, ``[buffer, (count, displacement)]``,
    ``[buffer, count, datatype]``, ``[buffer, (count, displacement), datatype]``,
    ``[buffer, count, displacement, datatype]``; a count of the ``pairs`` types is (count, displacement).
    The vector collectives read every rank's counts and displacements in the same places, and only a tuple
    there is the pair (a list is counts), as in mpi4py."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    if len(spec) == 2:
        buffer, second = spec
        if isinstance(second, (Datatype, str)):
            return buffer, None, None, datatype_of(second, what)
        if isinstance(second, pairs):
            return (buffer, *_pair(second, what), None)
        return buffer, second, None, None
    if len(spec) == 3:
        buffer, count, datatype = spec
        return (buffer, *(_pair(count, what) if isinstance(count, pairs) else (count, None)),
                datatype_of(datatype, what))
    if len(spec) == 4:
        buffer, count, displacement, datatype = spec
        return buffer, count, displacement, datatype_of(datatype, what)
    raise ValueError(f"{what}: a buffer spec is a buffer or a list of 2 to 4 items ([buffer, datatype], "
                     f"[buffer, count, datatype], [buffer, count, displacement, datatype]), not {len(spec)}")


def _pair(pair: Any, what: str) -> tuple[Any, Any]:
    if len(pair) != 2:
        raise ValueError(f"{what}: a tuple in a buffer spec is (count, displacement), here {len(pair)} items; "
                         "give a vector collective's counts as a list")
    return pair[0], pair[1]


def datatype_of(datatype: Any, what: str) -> Datatype | None:
    """A spec's datatype: an ``MPI`` datatype, or a NumPy type code as mpi4py takes one (``"d"``)."""
    if datatype is None or isinstance(datatype, Datatype):
        return datatype
    try:
        return Datatype(str(datatype), datatype)
    except TypeError:
        raise TypeError(f"{what}: {datatype!r} is not a datatype: pass one of MPI's (MPI.DOUBLE) or a NumPy type "
                        "code (\"d\")") from None


def buffer_of(spec: Any, what: str, receives: bool = False, blocks: int = 1) -> np.ndarray:
    """The memory of a buffer spec (``spec_parts``) as a one-dimensional array, in memory order, sharing it:
    from its displacement on, ``count`` items for each of ``blocks`` ranks if it gives a count (a collective's
    count is one rank's, as MPI's), else the rest; one that ``receives`` must be writable (checked before
    anything moves, as mpi4py does)."""
    if spec is IN_PLACE:
        raise MPIException(ERR_ARG, f"{what}: MPI.IN_PLACE is not a buffer this call can take in that place")
    buffer, count, displacement, datatype = spec_parts(spec, what)
    flat = _flat(buffer, datatype, what)
    start = 0
    if displacement is not None:
        if not is_int(displacement) or not 0 <= displacement <= flat.size:
            raise ValueError(f"{what}: displacement {displacement!r} is not an item of the buffer's {flat.size}")
        start = int(displacement)
    end = flat.size
    if count is not None:
        if not is_int(count) or count < 0:
            raise ValueError(f"{what}: count {count!r} is not an int from 0")
        end = start + int(count) * blocks
        if end > flat.size:
            each = f" for each of {blocks} ranks" if blocks > 1 else ""
            raise ValueError(f"{what}: count {count}{each} from item {start} is more than the buffer's "
                             f"{flat.size} items")
    flat = flat[start:end]
    if receives and not flat.flags.writeable:
        raise BufferError(f"{what}: the receive buffer is read-only")
    return flat


def _flat(spec: Any, datatype: Datatype | None, what: str) -> np.ndarray:
    """A buffer's whole memory as a one-dimensional array of ``datatype``'s items (or its own)."""
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
            if flat.nbytes % datatype.dtype.itemsize:
                raise ValueError(f"{what}: the buffer's {flat.nbytes} bytes are not a whole number of "
                                 f"{datatype.name} items ({datatype.dtype.itemsize} bytes apart)")
            flat = flat.view(np.uint8).view(datatype.dtype)
        return flat
    try:
        view = memoryview(spec)
    except TypeError:
        raise TypeError(f"{what}: {type(spec).__name__} is not a buffer; pass a NumPy array (or use the "
                        f"lowercase method for Python objects)") from None
    return np.frombuffer(view, datatype.dtype if datatype else np.dtype(view.format or "B")).reshape(-1)


def spec_datatype(spec: Any) -> Datatype | None:
    """The datatype a buffer spec names (``[buf, MPI.INT]``...), or None if it names none."""
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        return None
    named = spec[-1]
    return named if isinstance(named, Datatype) else None


def same_datatype(send: np.ndarray, recv: np.ndarray, what: str) -> None:
    """A reduction's send and receive buffers hold one datatype, as mpi4py requires (a cast would change the
    values silently)."""
    if send.dtype != recv.dtype:
        raise ValueError(f"{what}: mismatch in send and receive datatypes: the send buffer holds {send.dtype}, "
                         f"the receive buffer {recv.dtype}")


def fill(recvbuf: np.ndarray, values: np.ndarray, what: str) -> None:
    """``values`` into ``recvbuf`` (``_buffer``'s view of the caller's memory), converting the dtype."""
    if recvbuf.size != values.size:
        raise ValueError(f"{what}: the receive buffer holds {recvbuf.size} elements, the result has {values.size}")
    np.copyto(recvbuf, values.reshape(-1), casting="unsafe")
