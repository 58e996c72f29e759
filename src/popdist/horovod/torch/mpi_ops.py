"""Horovod's tensor collectives for torch: allreduce, allgather, broadcast (and their in-place and async forms).

Each takes a tensor and returns a new tensor of the input's dtype and device; ``allreduce``, ``allgather``
and ``broadcast`` are autograd functions, differentiable as Horovod's are. A contiguous CPU tensor reaches
the fabric without a copy (``Tensor.numpy()`` shares its memory), and the fabric's result, a fresh array,
becomes the returned tensor without one (``torch.from_numpy``). bfloat16 has no NumPy dtype: it is reduced
in float32 and rounded back.

The async forms run the collective at once and return a handle that is already complete (``poll`` is True,
``synchronize`` returns the result): the fabric has no background thread, and every instance calls the
collectives in the same order, as Horovod requires anyway.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch.autograd.graph import increment_version

from popdist.backend import _backend, current_fabric, current_group
from popdist.horovod.common import (  # (Horovod's mpi_ops has these names too: programs import them from it)
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allreduce_array,
    barrier,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    nccl_built,
    rank,
    require_init,
    resolve_op,
    shutdown,
    size,
)
from popdist.horovod.common import _state as _hvd_state  # (``is_initialized()`` without a call, in the hot paths)
from popdist.horovod.common.exceptions import HorovodInternalError
from popdist.horovod.torch.compression import Compression, NoneCompressor
from popdist.ragged import allgather_rows
from simipu.fabric.errors import CollectiveMismatchError

__all__ = [
    "Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "ReduceOp", "Sum", "allgather",
    "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "cross_rank", "cross_size", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "init", "is_initialized",
    "local_rank", "local_size", "mpi_threads_supported", "nccl_built", "poll", "rank", "shutdown", "size",
    "synchronize",
]


def to_array(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values as a NumPy array, sharing memory when the tensor is a contiguous CPU tensor."""
    if tensor.is_cpu and tensor.dtype is not torch.bfloat16 and tensor.is_contiguous():
        try:  # the usual case, first: 0.6 us less a call than the general path below
            return tensor.detach().numpy()
        except RuntimeError:  # a lazy conjugate or negation bit: resolved below
            pass
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype is torch.bfloat16:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.resolve_conj().resolve_neg().numpy()


def to_tensor(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``array`` (which nothing else holds) as a tensor of ``like``'s dtype and device, copied only if it must."""
    out = torch.from_numpy(array)
    if out.dtype is not like.dtype:
        out = out.to(like.dtype)
    if not like.is_cpu:  # (comparing devices makes two objects a call)
        out = out.to(like.device)
    return out


def _allreduce(tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float) -> torch.Tensor:
    return to_tensor(allreduce_array(to_array(tensor), op, prescale, postscale, tensor.dtype is torch.bfloat16),
                     tensor)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce as an autograd function: the gradient is the allreduce of the gradient with the same op."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float) -> torch.Tensor:
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return _allreduce(tensor, op, prescale, postscale)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        return _allreduce(grad_output, ctx.op, ctx.prescale, ctx.postscale), None, None, None


# The common call, a floating-point CPU tensor with no scaling, compression or gradient to track, goes to the
# fabric with as few calls into torch as can tell it apart: under poprun each such call costs more than on its
# own, as the collective's arrays have pushed torch's code and data out of the caches. Measured on a stub
# fabric (4 KiB, best of many): popdist.collectives 0.55 us a call, this path 1.6 us, of which
# ``Tensor.numpy()`` is 0.47 us and ``torch.from_numpy`` with the result's freeing about 0.6 us (the floor for
# tensor in, new tensor out); checking dtype, device and layout in torch first made it 1.8 us. Every other
# call takes the general path, which gives the same bits.
_FAST_DTYPES = frozenset("efd")  # NumPy's float16, float32, float64 (``dtype.char``): integers' Average truncates
_FAST_OPS = {None: "mean", ReduceOp.Average: "mean", ReduceOp.Sum: "sum", ReduceOp.Min: "min",
             ReduceOp.Max: "max", ReduceOp.Product: "prod"}


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: object = None) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced over every instance (default: the average). ``name`` is accepted
    and unused: collectives match by the order instances call them."""
    fabric = _backend.fabric
    if (fabric is not None and _hvd_state.initialised and average is None and compression is NoneCompressor
            and process_set is None and prescale_factor == 1.0 and postscale_factor == 1.0
            and (op is None or type(op) is ReduceOp)):
        fabric_op = _FAST_OPS.get(op)  # (None for Adasum: that raises on the general path)
        try:  # ``Tensor.numpy()`` refuses what needs the general path: another device, bfloat16, a lazy negation
            # bit, a gradient to track (autograd on); a strided tensor gives a strided array, which the fabric
            # copies as the general path does
            array = tensor.numpy()
        except (AttributeError, RuntimeError, TypeError):  # (AttributeError: a NumPy array)
            array = None
        if fabric_op is not None and array is not None and array.dtype.char in _FAST_DTYPES:
            if not _backend.grouped and array.flags.c_contiguous:  # (``popdist.collectives.allreduce``'s hot path)
                plan = _backend.hot_allreduces.get((array.dtype, array.shape, fabric_op))
                if plan is not None:
                    return torch.from_numpy(plan.allreduce(0, array))
            return torch.from_numpy(fabric.allreduce(array, fabric_op, _backend.groups.members))
    _no_process_set(process_set)
    resolved = resolve_op(op, average)
    compressed, context = compression.compress(tensor)
    if compressed.requires_grad and torch.is_grad_enabled():
        reduced = HorovodAllreduce.apply(compressed, resolved, float(prescale_factor), float(postscale_factor))
    else:  # nothing to differentiate: the same result without autograd's bookkeeping (~10 us a call)
        reduced = _allreduce(compressed, resolved, float(prescale_factor), float(postscale_factor))
    return compression.decompress(reduced, context)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: object = None) -> torch.Tensor:
    """``allreduce`` into ``tensor`` itself; returns ``tensor``."""
    fabric = _backend.fabric
    if (fabric is not None and _hvd_state.initialised and average is None and process_set is None
            and prescale_factor == 1.0 and postscale_factor == 1.0 and (op is None or type(op) is ReduceOp)):
        fabric_op = _FAST_OPS.get(op)
        array = _own_array(tensor) if fabric_op is not None else None
        if array is not None:  # (the fabric reduces into the tensor's memory: no result to copy back)
            fabric.allreduce(array, fabric_op, _backend.groups.members, array)  # type: ignore[arg-type]
            increment_version(tensor)
            return tensor
    _no_process_set(process_set)
    result = _allreduce(tensor, resolve_op(op, average), float(prescale_factor), float(postscale_factor))
    with torch.no_grad():
        tensor.copy_(result)
    return tensor


def _own_array(tensor: torch.Tensor) -> np.ndarray | None:
    """The memory of ``tensor`` as an array the fabric may write in place (then ``increment_version``, as an
    in-place torch op does, so that autograd still sees the change), if it is a C-contiguous floating-point CPU
    tensor with no gradient to track; else None (the general path, with a copy back)."""
    try:  # (``Tensor.numpy()`` refuses another device, bfloat16, a lazy negation bit, a gradient to track)
        array = tensor.numpy()
    except (AttributeError, RuntimeError, TypeError):  # (AttributeError: a NumPy array)
        return None
    return array if array.dtype.char in _FAST_DTYPES and array.flags.c_contiguous and array.flags.writeable else None


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: object = None) -> list[torch.Tensor]:
    """``allreduce`` of each tensor, the results in the same order."""
    resolved = resolve_op(op, average)
    return [allreduce(t, None, name, compression, resolved, prescale_factor, postscale_factor, process_set)
            for t in tensors]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: object = None) -> list[torch.Tensor]:
    """``allreduce_`` of each tensor, in place; returns the tensors."""
    resolved = resolve_op(op, average)
    return [allreduce_(t, None, name, resolved, prescale_factor, postscale_factor, process_set) for t in tensors]


class HorovodAllgather(torch.autograd.Function):
    """Allgather as an autograd function: each instance's gradient is its rows of the averaged gradient (as
    Horovod's since 0.22, whose allgather and broadcast gradients had been the sum, ``size`` times too large)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        parts = allgather_rows(to_array(tensor), current_group())
        ctx.rows = [part.shape[0] for part in parts]
        return to_tensor(np.concatenate(parts), tensor)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        averaged = _allreduce(grad_output, ReduceOp.Average, 1.0, 1.0)
        members = current_group()  # (execute_on_instances: the rows are the group's, in member order)
        me = members.index(rank()) if members else rank()
        return averaged.narrow(0, sum(ctx.rows[:me]), ctx.rows[me]),


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: object = None) -> torch.Tensor:
    """Every instance's tensor concatenated on the first dimension, in rank order (first dimensions may
    differ; the others, and the dtype, may not)."""
    require_init()
    _no_process_set(process_set)
    return HorovodAllgather.apply(tensor)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast as an autograd function: the root's gradient is the average of every instance's (Horovod's
    since 0.22, as ``HorovodAllgather``'s); the others get 0."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        ctx.root_rank = root_rank
        return _broadcast(tensor, root_rank)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        averaged = _allreduce(grad_output, ReduceOp.Average, 1.0, 1.0)
        if rank() != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None


def _broadcast(tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
    root = agreed_root(root_rank)
    return to_tensor(current_fabric().broadcast(to_array(tensor), root, current_group()), tensor)


def _root(root_rank: Any) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < size():
        raise ValueError(f"root_rank={root_rank!r} is not a rank of this job (0 to {size() - 1})")
    return int(root_rank)


def agreed_root(root_rank: Any) -> int:
    """``root_rank``, once every instance has named the same one, as Horovod's coordinator checks (its error
    otherwise, on every instance). From three instances the fabric's small broadcast does not compare roots
    (the root writes and goes on), so the instances compare them here first; two compare them in the call."""
    root = _root(root_rank)
    fabric, members = current_fabric(), current_group()
    if (len(members) if members else fabric.num_instances) >= 3:
        roots = fabric.allgather(np.array([root], np.int64), members).reshape(-1)
        if (roots != root).any():
            raise CollectiveMismatchError(f"broadcast: mismatched root ranks: instances named {roots.tolist()}, "
                                          "in rank order; every one must name the same root_rank")
    return root


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: object = None) -> torch.Tensor:
    """A new tensor with the value of ``tensor`` on ``root_rank``."""
    _no_process_set(process_set)
    return HorovodBroadcast.apply(tensor, root_rank)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: object = None) -> torch.Tensor:
    """``broadcast`` into ``tensor`` itself (a parameter too); returns ``tensor``."""
    _no_process_set(process_set)
    fabric = _backend.fabric
    array = _own_array(tensor.detach()) if fabric is not None else None
    if array is not None:  # (into the tensor's memory, as ``allreduce_``; a parameter's too: its data, as copy_)
        fabric.broadcast(array, agreed_root(root_rank), _backend.groups.members, array)  # type: ignore[union-attr]
        increment_version(tensor)
        return tensor
    result = _broadcast(tensor, root_rank)
    with torch.no_grad():
        tensor.copy_(result)
    return tensor


def _no_process_set(process_set: object) -> None:
    if process_set is not None:
        raise NotImplementedError("process sets are not provided by poprun-py's Horovod: every collective "
                                  "spans the whole job (or popdist.execute_on_instances' instances)")


# -- async forms: done at once (see the module docstring) ------------------------------------------------------
_handles: dict[int, Any] = {}  # (a tensor, or a grouped call's list of them)
_next_handle = [0]


def _handle(result: Any) -> int:
    _next_handle[0] += 1
    _handles[_next_handle[0]] = result
    return _next_handle[0]


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: object = None) -> int:
    return _handle(allreduce(tensor, average, name, Compression.none, op, prescale_factor, postscale_factor,
                             process_set))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: object = None) -> int:
    return _handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: ReduceOp | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: object = None) -> int:
    return _handle(grouped_allreduce(tensors, average, name, Compression.none, op, prescale_factor,
                                     postscale_factor, process_set))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: ReduceOp | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: object = None) -> int:
    return _handle(grouped_allreduce_(tensors, average, name, op, prescale_factor, postscale_factor, process_set))


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: object = None) -> int:
    return _handle(allgather(tensor, name, process_set))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: object = None) -> int:
    return _handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: object = None) -> int:
    return _handle(broadcast_(tensor, root_rank, name, process_set))


def poll(handle: int) -> bool:
    """True: every operation is complete when its async call returns."""
    if handle not in _handles:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return True


def synchronize(handle: int) -> Any:
    """The result of the async operation ``handle``; None for a handle already synchronized (as Horovod's)."""
    return _handles.pop(handle, None)
