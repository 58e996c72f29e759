"""``mpi4py.MPI`` over poprun-py's fabric: ``COMM_WORLD`` (every instance; rank = instance index),
``COMM_SELF``, ``COMM_NULL``, the reduction ops, the datatypes, ``IN_PLACE``, ``Wtime``, ``Get_processor_name``.

Anything else of mpi4py's ``MPI`` module raises ``NotProvidedError`` naming it (an AttributeError, so
``hasattr(MPI, name)`` is False), rather than doing something unlike MPI.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import numpy as np

from popdist.backend import current_fabric, fabric_place
from popdist.mpi4py import rc
from popdist.mpi4py.comm import (
    COMM_NULL,
    Cartcomm,
    Comm,
    Distgraphcomm,
    Graphcomm,
    Topocomm,
    finalize_communicators,
)
from popdist.mpi4py.graphs import DIST_GRAPH, GRAPH, UNWEIGHTED, WEIGHTS_EMPTY
from popdist.mpi4py.reductions import (
    BAND,
    BOR,
    BXOR,
    LAND,
    LOR,
    LXOR,
    MAX,
    MAXLOC,
    MIN,
    MINLOC,
    NO_OP,
    OP_NULL,
    PROD,
    REPLACE,
    SUM,
    Op,
)
from popdist.mpi4py.requests import REQUEST_NULL, Request
from popdist.mpi4py.specs import (
    ANY_SOURCE,
    ANY_TAG,
    COMM_TYPE_SHARED,
    ERR_ARG,
    ERR_BUFFER,
    ERR_COMM,
    ERR_COUNT,
    ERR_DIMS,
    ERR_GROUP,
    ERR_IN_STATUS,
    ERR_INTERN,
    ERR_OP,
    ERR_OTHER,
    ERR_PENDING,
    ERR_RANK,
    ERR_REQUEST,
    ERR_ROOT,
    ERR_TAG,
    ERR_TOPOLOGY,
    ERR_TRUNCATE,
    ERR_TYPE,
    ERR_UNKNOWN,
    IN_PLACE,
    PROC_NULL,
    README_SECTION,
    SUCCESS,
    UNDEFINED,
    Datatype,
    MPIException,
    NotProvidedError,
    RankError,
    Status,
    error_string,
)
from popdist.mpi4py.topology import CART, compute_dims

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "BAND", "BOOL", "BOR", "BXOR", "BYTE", "CART", "CHAR", "COMM_NULL", "COMM_SELF",
    "COMM_TYPE_SHARED", "COMM_WORLD", "COMPLEX", "C_BOOL", "C_DOUBLE_COMPLEX", "C_FLOAT_COMPLEX", "Cartcomm", "Comm",
    "Compute_dims", "DIST_GRAPH", "DOUBLE", "DOUBLE_COMPLEX", "DOUBLE_INT", "Datatype", "Distgraphcomm", "ERR_ARG",
    "ERR_BUFFER", "ERR_COMM", "ERR_COUNT", "ERR_DIMS", "ERR_GROUP", "ERR_INTERN", "ERR_IN_STATUS", "ERR_OP",
    "ERR_OTHER", "ERR_PENDING", "ERR_RANK", "ERR_REQUEST", "ERR_ROOT", "ERR_TAG", "ERR_TOPOLOGY", "ERR_TRUNCATE",
    "ERR_TYPE", "ERR_UNKNOWN", "Exception", "FLOAT", "FLOAT_INT", "Finalize", "GRAPH", "Get_error_class",
    "Get_error_string", "Get_processor_name", "Get_version", "Graphcomm", "Is_thread_main",
    "INFO_NULL", "INT", "INT16_T", "INT32_T", "INT64_T", "INT8_T", "INT_INT", "IN_PLACE", "Init", "Intracomm",
    "Is_finalized", "Is_initialized", "LAND", "LONG", "LONG_DOUBLE", "LONG_DOUBLE_INT", "LONG_INT", "LONG_LONG",
    "LOR", "LXOR", "MAX", "MAXLOC", "MIN", "MINLOC", "NO_OP", "NotProvidedError", "OP_NULL", "Op", "PROC_NULL",
    "PROD", "Query_thread", "REPLACE", "REQUEST_NULL", "Request", "SHORT", "SHORT_INT", "SIGNED_CHAR", "SUCCESS", "SUM",
    "Status", "THREAD_FUNNELED", "THREAD_MULTIPLE", "THREAD_SERIALIZED",
    "THREAD_SINGLE", "TWOINT", "Topocomm", "UINT16_T", "UINT32_T", "UINT64_T",
    "UINT8_T", "UNDEFINED", "UNSIGNED", "UNSIGNED_CHAR", "UNSIGNED_LONG", "UNSIGNED_SHORT", "UNWEIGHTED",
    "WEIGHTS_EMPTY", "Wtick", "Wtime",
]

Intracomm = Comm
Compute_dims = compute_dims
Exception = MPIException  # noqa: A001 - mpi4py's name: ``except MPI.Exception``
COMM_WORLD = Comm(None, "MPI_COMM_WORLD")


class _SelfComm(Comm):
    """This instance alone (its members are known only once the process knows its instance index)."""

    def _group(self) -> tuple[int, ...]:
        return (fabric_place()[0],)

    def Get_size(self) -> int:
        return 1

    def Get_rank(self) -> int:
        return 0

    size = property(Get_size)
    rank = property(Get_rank)

    def _instance(self, rank: int, what: str) -> int:
        if rank != 0:
            raise RankError(f"{what}: rank {rank!r} is not in MPI_COMM_SELF (only 0)")
        return fabric_place()[0]

    def _rank_of(self, instance: int) -> int:
        return 0


COMM_SELF = _SelfComm(None, "MPI_COMM_SELF", 1)


class _NoInfo:
    """``MPI.INFO_NULL``: no hints, what programs pass where a call takes an ``Info`` (``Split_type``)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<mpi4py.MPI.Info INFO_NULL (poprun-py)>"


INFO_NULL = _NoInfo()

# (``inferred``: what a buffer of that dtype that names no datatype is, as mpi4py infers it from the type code;
# every name is a handle of its own, as in MPI: MPI.INT != MPI.INT32_T, and MPI.BOOL is MPI.C_BOOL, as in mpi4py)
UNSIGNED_CHAR = Datatype("MPI_UNSIGNED_CHAR", "u1", inferred=True)
BYTE = Datatype("MPI_BYTE", "u1")
UINT8_T = Datatype("MPI_UINT8_T", "u1")
CHAR = Datatype("MPI_CHAR", "i1", typechar="c")
SIGNED_CHAR = Datatype("MPI_SIGNED_CHAR", "i1", inferred=True)
INT8_T = Datatype("MPI_INT8_T", "i1")
SHORT = Datatype("MPI_SHORT", "i2", inferred=True)
INT16_T = Datatype("MPI_INT16_T", "i2")
INT = Datatype("MPI_INT", "i4", inferred=True)
INT32_T = Datatype("MPI_INT32_T", "i4")
LONG = Datatype("MPI_LONG", "i8", inferred=True)
LONG_LONG = Datatype("MPI_LONG_LONG_INT", "q")
INT64_T = Datatype("MPI_INT64_T", "i8")
UNSIGNED_SHORT = Datatype("MPI_UNSIGNED_SHORT", "u2", inferred=True)
UINT16_T = Datatype("MPI_UINT16_T", "u2")
UNSIGNED = Datatype("MPI_UNSIGNED", "u4", inferred=True)
UINT32_T = Datatype("MPI_UINT32_T", "u4")
UNSIGNED_LONG = Datatype("MPI_UNSIGNED_LONG", "u8", inferred=True)
UINT64_T = Datatype("MPI_UINT64_T", "u8")
FLOAT = Datatype("MPI_FLOAT", "f4", inferred=True)
DOUBLE = Datatype("MPI_DOUBLE", "f8", inferred=True)
LONG_DOUBLE = Datatype("MPI_LONG_DOUBLE", np.longdouble, inferred=True)
C_FLOAT_COMPLEX = Datatype("MPI_C_COMPLEX", "c8", inferred=True)
COMPLEX = Datatype("MPI_COMPLEX", "c8")
C_DOUBLE_COMPLEX = Datatype("MPI_C_DOUBLE_COMPLEX", "c16", inferred=True)
DOUBLE_COMPLEX = Datatype("MPI_DOUBLE_COMPLEX", "c16")
BOOL = C_BOOL = Datatype("MPI_C_BOOL", "?", inferred=True)
# MAXLOC's and MINLOC's (value, index) pairs, laid out as C's structs: a buffer of them is a structured array
# of two fields (any names) or, for TWOINT, an int32 array of pairs
FLOAT_INT = Datatype("MPI_FLOAT_INT", [("value", "f4"), ("index", "i4")], inferred=True)
DOUBLE_INT = Datatype("MPI_DOUBLE_INT", np.dtype([("value", "f8"), ("index", "i4")], align=True), 12, inferred=True)
LONG_INT = Datatype("MPI_LONG_INT", np.dtype([("value", "i8"), ("index", "i4")], align=True), 12, inferred=True)
TWOINT = INT_INT = Datatype("MPI_2INT", [("value", "i4"), ("index", "i4")], inferred=True)
SHORT_INT = Datatype("MPI_SHORT_INT", np.dtype([("value", "i2"), ("index", "i4")], align=True), 6, inferred=True)
LONG_DOUBLE_INT = Datatype("MPI_LONG_DOUBLE_INT", np.dtype([("value", np.longdouble), ("index", "i4")], align=True),
                           np.dtype(np.longdouble).itemsize + 4, inferred=True)

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
_finalized = [False]
_initialized = [False]


def Wtime() -> float:
    """Seconds since an arbitrary moment (monotonic), as ``MPI_Wtime``."""
    return time.monotonic()


def Wtick() -> float:
    return time.get_clock_info("monotonic").resolution


def Get_error_string(errorcode: int) -> str:
    """What an error class means, as ``str(MPI.Exception(errorcode))``."""
    return error_string(errorcode)


def Get_error_class(errorcode: int) -> int:
    return errorcode  # (every error here is a class)


def Get_processor_name() -> str:
    return socket.gethostname()


def Get_version() -> tuple[int, int]:
    return (3, 1)


def Get_library_version() -> str:
    return "poprun-py fabric (no MPI library)"


def Init() -> None:
    """Connect this instance to the job's fabric now (PopDist's initialisation, if nothing did it first), as
    ``MPI_Init`` connects the ranks: so that a message sent before a rank's first call has come when that call
    (a ``test``, an ``iprobe``) looks. ``import mpi4py.MPI`` calls it unless ``mpi4py.rc.initialize`` is False,
    as mpi4py's import does. After ``Finalize``: ``MPI.Exception``, as MPI allows no second initialisation."""
    _refuse_after_finalize("Init")
    current_fabric()
    _initialized[0] = True


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    Init()
    return Query_thread()


def Is_initialized() -> bool:
    return _initialized[0]


def Finalize() -> None:
    """From now on, any call on a communicator, and a second ``Finalize``, raises ``MPI.Exception`` with
    ``ERR_OTHER``, as MPI forbids them (Open MPI aborts the job); the fabric stays up for PopDist's calls."""
    _refuse_after_finalize("Finalize")
    _finalized[0] = True
    finalize_communicators()


def _refuse_after_finalize(what: str) -> None:
    if _finalized[0]:
        raise MPIException(ERR_OTHER, f"{what}: called after MPI.Finalize(); MPI allows it once, and no "
                                      "initialisation after it")


def Is_finalized() -> bool:
    return _finalized[0]


def Query_thread() -> int:
    return THREAD_SERIALIZED  # one thread at a time may call the collectives


# -- threads ---------------------------------------------------------------------------------------------
#: The thread that imported this module, and so initialised MPI (``Init`` at import, unless ``rc.initialize``).
_MAIN_THREAD = threading.get_ident()


def Is_thread_main() -> bool:
    """Whether this is MPI's main thread: the one that imported ``mpi4py.MPI``. (``Query_thread`` says
    ``THREAD_SERIALIZED``: the fabric takes one call at a time, so two threads in collectives at once, even on
    two communicators, break it.)"""
    return threading.get_ident() == _MAIN_THREAD


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotProvidedError(f"MPI.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} for what is")


if rc.initialize:
    Init()
