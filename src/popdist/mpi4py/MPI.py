"""``mpi4py.MPI`` over poprun-py's fabric: ``COMM_WORLD`` (every instance; rank = instance index),
``COMM_SELF``, ``COMM_NULL``, the reduction ops, the datatypes, ``IN_PLACE``, ``Wtime``, ``Get_processor_name``.

Anything else of mpi4py's ``MPI`` module raises ``NotProvidedError`` naming it (an AttributeError, so
``hasattr(MPI, name)`` is False), rather than doing something unlike MPI.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from popdist.backend import current_fabric, fabric_place
from popdist.mpi4py import rc
from popdist.mpi4py.comm import COMM_NULL, Comm
from popdist.mpi4py.requests import REQUEST_NULL, Request
from popdist.mpi4py.specs import (
    ANY_SOURCE,
    ANY_TAG,
    COMM_TYPE_SHARED,
    ERR_ARG,
    ERR_COMM,
    ERR_IN_STATUS,
    ERR_RANK,
    ERR_TAG,
    ERR_TRUNCATE,
    IN_PLACE,
    MAX,
    MIN,
    PROC_NULL,
    PROD,
    README_SECTION,
    SUM,
    UNDEFINED,
    Datatype,
    MPIException,
    NotProvidedError,
    Op,
    RankError,
    Status,
)

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "BOOL", "BYTE", "CHAR", "COMM_NULL", "COMM_SELF", "COMM_TYPE_SHARED", "COMM_WORLD",
    "Comm", "DOUBLE", "Datatype", "ERR_ARG", "ERR_COMM", "ERR_IN_STATUS", "ERR_RANK", "ERR_TAG", "ERR_TRUNCATE",
    "Exception", "FLOAT", "Finalize", "Get_processor_name", "Get_version", "INFO_NULL", "INT", "INT16_T", "INT32_T",
    "INT64_T", "INT8_T", "IN_PLACE", "Init",
    "Intracomm", "Is_finalized", "Is_initialized", "LONG", "LONG_LONG", "MAX", "MIN", "NotProvidedError", "Op",
    "PROC_NULL", "PROD", "Query_thread", "REQUEST_NULL", "Request", "SHORT", "SUM", "Status", "THREAD_MULTIPLE",
    "THREAD_SINGLE", "UINT16_T", "UINT32_T", "UINT64_T", "UINT8_T", "UNDEFINED", "UNSIGNED", "UNSIGNED_CHAR",
    "UNSIGNED_LONG", "Wtick", "Wtime",
]

Intracomm = Comm
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

BYTE = Datatype("BYTE", "u1")
CHAR = Datatype("CHAR", "i1")
UNSIGNED_CHAR = UINT8_T = Datatype("UNSIGNED_CHAR", "u1")
SHORT = INT16_T = Datatype("SHORT", "i2")
INT = INT32_T = Datatype("INT", "i4")
LONG = LONG_LONG = INT64_T = Datatype("LONG", "i8")
INT8_T = Datatype("INT8_T", "i1")
UINT16_T = Datatype("UINT16_T", "u2")
UNSIGNED = UINT32_T = Datatype("UNSIGNED", "u4")
UNSIGNED_LONG = UINT64_T = Datatype("UNSIGNED_LONG", "u8")
FLOAT = Datatype("FLOAT", "f4")
DOUBLE = Datatype("DOUBLE", "f8")
BOOL = Datatype("BOOL", "?")

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
_finalized = [False]
_initialized = [False]


def Wtime() -> float:
    """Seconds since an arbitrary moment (monotonic), as ``MPI_Wtime``."""
    return time.monotonic()


def Wtick() -> float:
    return time.get_clock_info("monotonic").resolution


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
    as mpi4py's import does."""
    current_fabric()
    _initialized[0] = True


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    Init()
    return Query_thread()


def Is_initialized() -> bool:
    return _initialized[0]


def Finalize() -> None:
    _finalized[0] = True


def Is_finalized() -> bool:
    return _finalized[0]


def Query_thread() -> int:
    return THREAD_SERIALIZED  # one thread at a time may call the collectives


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotProvidedError(f"MPI.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} for what is")


if rc.initialize:
    Init()
