"""The framework-free half of Horovod's API: initialisation, ranks and sizes, reduction ops, and the
reductions on NumPy arrays that ``horovod.torch`` wraps.

Horovod's ranks are PopDist's instances: ``rank()`` is ``popdist.getInstanceIndex()``, ``size()`` the number
of instances, ``local_rank()``/``local_size()`` the instance's place among those on its host. As in Horovod,
``cross_rank()``/``cross_size()`` are the rank and size among the instances with this ``local_rank()`` (one
per host when hosts hold as many instances each).
"""

from __future__ import annotations

import warnings
from enum import IntEnum
from typing import TYPE_CHECKING

from popdist import collectives, core
from popdist.backend import current_fabric, current_group

if TYPE_CHECKING:
    import numpy as np

    from popdist.backend import Collectives

__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum",
    "allreduce_array", "barrier", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "init",
    "is_homogeneous", "is_initialized", "local_rank", "local_size", "require_init", "resolve_op", "rank",
    "rocm_built", "shutdown", "size",
]


class ReduceOp(IntEnum):
    """Horovod's reduction ops (the values of Horovod's C library)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum, ReduceOp.Min,
                                           ReduceOp.Max, ReduceOp.Product)
_FABRIC_OPS = {ReduceOp.Average: "mean", ReduceOp.Sum: "sum", ReduceOp.Min: "min", ReduceOp.Max: "max",
               ReduceOp.Product: "prod"}


class _State:
    def __init__(self) -> None:
        self.initialised = False


_state = _State()


def init(comm: object = None, process_sets: object = None) -> None:
    """Start Horovod. Calling it again does nothing.

    It connects nothing itself: the first collective joins the job's fabric (PopDist's ``init()``, unless the
    program called it), so ``popdist.init()`` may come before or after it, as with Graphcore's PopDist and
    Horovod. ``comm`` (an MPI communicator or a list of ranks) and ``process_sets`` are not supported: every
    instance of the job takes part.
    """
    if comm is not None or process_sets is not None:
        raise NotImplementedError("hvd.init(comm=..., process_sets=...) is not provided by poprun-py: "
                                  "call hvd.init() and every instance of the job takes part")
    _name_the_agreement()
    _state.initialised = True


def shutdown() -> None:
    """Stop Horovod (``init()`` may be called again). The fabric stays PopDist's, closed at exit."""
    _state.initialised = False


def is_initialized() -> bool:
    return _state.initialised


def require_init() -> None:
    """Horovod's rule: nothing before ``init()`` (or after ``shutdown()``), collectives included, though the
    fabric they would use may be joined already (by ``popdist.collectives``)."""
    if not _state.initialised:
        raise ValueError("Horovod (poprun-py) is not initialised yet: call hvd.init() first")


def rank() -> int:
    require_init()
    return collectives.rank()  # (the fabric's, once connected: cheap enough for every step)


def size() -> int:
    require_init()
    return collectives.size()


def local_rank() -> int:
    require_init()
    return core.getLocalInstanceIndex()


def local_size() -> int:
    require_init()
    launch = core._launch()
    return 1 if launch is None else launch.num_local_instances


def cross_rank() -> int:
    """This instance's rank among those with its local rank: its host's index, as poprun places instances
    on hosts in contiguous blocks of ``local_size()``."""
    return rank() // local_size()


def cross_size() -> int:
    """The number of instances with this local rank: the number of hosts."""
    return size() // local_size()


def is_homogeneous() -> bool:
    """True when every host holds as many instances (poprun places them so)."""
    require_init()
    return size() == local_size() * cross_size()


def _not_here() -> bool:
    """False: none of the libraries Horovod is built with or can use (MPI, Gloo, NCCL, CUDA, ROCm, DDL, oneCCL)
    is poprun-py's; its collectives run over the fabric."""
    return False


mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = _not_here
nccl_built = cuda_built = rocm_built = ddl_built = ccl_built = _not_here


def barrier(process_set: object = None) -> None:
    """Wait until every instance has called it (Horovod's ``barrier``)."""
    require_init()
    if process_set is not None:
        raise NotImplementedError("process sets are not provided by poprun-py's Horovod")
    current_fabric().barrier(current_group())


def resolve_op(op: object, average: object) -> ReduceOp:
    """Horovod's rules: ``op`` and the deprecated ``average`` not both; neither means Average."""
    if op is not None and average is not None:
        raise ValueError("give op= or the deprecated average=, not both (op= supersedes average=)")
    if average is not None:
        warnings.warn("average= is deprecated in Horovod; use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        return ReduceOp.Average if average else ReduceOp.Sum
    if op is None:
        return ReduceOp.Average
    try:
        resolved = ReduceOp(op)  # type: ignore[arg-type]  # (what is not an op raises, below)
    except (ValueError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or "
                         "hvd.Product") from None
    if resolved is ReduceOp.Adasum:
        raise NotImplementedError("hvd.Adasum is not provided by poprun-py's Horovod (it needs Horovod's own "
                                  "MPI/NCCL kernels); use op=hvd.Average or op=hvd.Sum")
    return resolved


def allreduce_array(x: np.ndarray, op: ReduceOp, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, bfloat16: bool = False) -> np.ndarray:
    """A new array: ``x`` reduced over the instances (in instance order: the same bits everywhere).

    Average of an integer array sums, scales once by ``postscale_factor / size`` and truncates toward zero, as
    Horovod's scaling does (dividing and truncating first, then scaling, lost what the division had left).
    ``bfloat16``: ``x`` holds a bfloat16 tensor's values in float32.

    Such a call (a scale factor, an integer Average, bfloat16) sends the fabric a plain sum or float32 array,
    whose header cannot tell it from another instance's plain call: its instances compare op, factors and
    dtype first (``_check_agreement``), as Horovod's coordinator does.
    """
    require_init()
    fabric, group = current_fabric(), current_group()
    integer_average = op is ReduceOp.Average and x.dtype.kind in "iu"
    if integer_average or bfloat16 or prescale_factor != 1.0 or postscale_factor != 1.0:
        _check_agreement(fabric, group, op, prescale_factor, postscale_factor, None if bfloat16 else x.dtype)
    if prescale_factor != 1.0:
        x = _scaled(x, prescale_factor)
    if integer_average:
        members = len(group) if group else fabric.num_instances
        return (fabric.allreduce(x, "sum", group) * (postscale_factor / members)).astype(x.dtype)
    out = fabric.allreduce(x, _FABRIC_OPS[op], group)
    return out if postscale_factor == 1.0 else _scaled(out, postscale_factor)


def _scaled(x: np.ndarray, factor: float) -> np.ndarray:
    """``x`` times ``factor``, in ``x``'s dtype, as Horovod scales a buffer: float16 in float32, rounded back
    once (NumPy alone would round the factor to float16 first), integers through float64, truncated."""
    import numpy as np

    if x.dtype == np.float16:
        return (x.astype(np.float32) * np.float32(factor)).astype(np.float16)
    return (x * factor).astype(x.dtype, copy=False)


#: The shape of the float64 array ``_check_agreement`` gathers: (op, dtype), (prescale, postscale).
_AGREEMENT = (2, 2)


def _name_the_agreement() -> None:
    """Have the fabric's mismatch messages name the agreement's allgather (``init``: on every instance, as the
    one that meets it may be making a plain call)."""
    import numpy as np

    from simipu.fabric.frames.header import ALLGATHER, name_call

    name_call(ALLGATHER, np.dtype(np.float64), _AGREEMENT, "hvd.allreduce's comparison of op, scale factors and "
              "dtype, which begins a call with a prescale or postscale factor, an integer Average or bfloat16")


def _check_agreement(fabric: Collectives, group: tuple[int, ...] | None, op: ReduceOp, prescale: float,
                     postscale: float, dtype: np.dtype | None) -> None:
    """Raise ``CollectiveMismatchError`` on every instance unless all name the same op, factors and dtype (None:
    bfloat16), in Horovod's wording. One small allgather: every instance judges the same rows alike. An instance making
    a plain call meanwhile meets this allgather instead of its allreduce: the fabric's mismatch, on all."""
    import numpy as np

    from simipu.fabric.errors import CollectiveMismatchError

    code = 0.0 if dtype is None else float(ord(np.dtype(dtype.str).char))  # (int64's "l" and "q" alike)
    mine = np.array([[int(op), code], [prescale, postscale]], np.float64)
    rows = fabric.allgather(mine, group)
    members = group or range(fabric.num_instances)
    for k, row in enumerate(rows):
        if row.tobytes() != rows[0].tobytes():
            first, other = members[0], members[k]
            break
    else:
        return
    (op0, code0), factors0 = rows[0]
    (op1, code1), factors1 = row
    if code0 != code1:
        raise CollectiveMismatchError(f"hvd.allreduce: Mismatched data types: instance {first} passed "
                                      f"{_dtype_name(code0)}, instance {other} {_dtype_name(code1)}; every "
                                      "instance must pass a tensor of the same dtype")
    if op0 != op1:
        raise CollectiveMismatchError(f"hvd.allreduce: Mismatched reduction operation: instance {first} asked for "
                                      f"{ReduceOp(int(op0)).name}, instance {other} for {ReduceOp(int(op1)).name}; "
                                      "every instance must name the same op")
    raise CollectiveMismatchError(f"hvd.allreduce: Mismatched prescale and/or postscale factors: instance {first} "
                                  f"gave {tuple(factors0.tolist())}, instance {other} {tuple(factors1.tolist())}; "
                                  "every instance must give the same")


def _dtype_name(code: float) -> str:
    import numpy as np

    return "bfloat16" if code == 0 else np.dtype(chr(int(code))).name
