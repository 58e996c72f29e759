"""Instance-level collectives on NumPy arrays: what PopDist programs used Horovod for.

Every instance calls the same collective in the same order (SPMD). Results
are deterministic: the reduction order is fixed by instance index, so the
same inputs give bit-identical results on every run and every instance.
Under ``execute_on_instances`` a collective spans only the named instances.
The first collective initialises PopDist if the program has not.

Horovod-shaped names are here too (``rank``, ``size``, ``local_rank``,
``local_size``, ``grouped_allreduce`` and the ops ``Sum``, ``Average``, ...),
so code written for ``horovod`` beside PopDist ports by changing an import.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, TypeVar

from popdist import core
from popdist.backend import _backend, current_fabric, current_group, instance_group

__all__ = [
    "Average", "Max", "Min", "Product", "Sum",
    "allgather", "allreduce", "allreduce_init", "barrier", "broadcast", "execute_on_instances", "grouped_allreduce",
    "local_rank", "local_size", "rank", "reduce_scatter", "size", "synchronize",
]

Sum, Average, Max, Min, Product = "sum", "mean", "max", "min", "prod"
_OPS = {
    "sum": Sum, "mean": Average, "average": Average, "avg": Average,
    "max": Max, "min": Min, "prod": Product, "product": Product,
}
T = TypeVar("T")
#: ``numpy.ndarray`` once the first collective has imported NumPy: an array of it needs no ``_array``; and
#: ``numpy.empty_like`` (the hot broadcast's result).
_ndarray: Any = None
_empty_like: Any = None
_NUMERIC = "biufc"  # the dtype kinds the collectives take


def _op(op: str) -> str:
    try:
        return _OPS[op]  # the usual case, without str() and lower()
    except (KeyError, TypeError):
        pass
    try:
        return _OPS[str(op).lower()]
    except KeyError:
        raise ValueError(f"unknown reduction {op!r}; use one of sum, mean, max, min, prod") from None


def _array(value: Any):
    """``value`` as a numeric NumPy array. (Every check here is paid on every collective: with more instances
    than cores a microsecond per call costs several per step, so it keeps to a dtype kind check.)"""
    global _ndarray, _empty_like
    import numpy as np  # with the first collective, not with popdist

    _ndarray, _empty_like = np.ndarray, np.empty_like
    array = np.asarray(value)
    if array.dtype.kind not in _NUMERIC:
        raise TypeError(f"collectives take numeric arrays, not {array.dtype}")
    return array


def allreduce(array: Any, op: str = Sum, out: Any = None):
    """Reduce ``array`` element-wise across instances (sum, mean, max, min, prod): a new array, or ``out``
    filled (``out=array``: in place, as MPI's ``IN_PLACE``). A wrong ``out`` (dtype, shape, not C-contiguous)
    raises ValueError once the allreduce is done."""
    if type(array) is _ndarray and not _backend.grouped:  # ``Fabric.allreduce``'s hot path, a frame nearer
        try:
            plan = _backend.hot_allreduces.get((array.dtype, array.shape, op))
        except TypeError:  # (an unhashable op: the general path says why it is wrong)
            plan = None
        # (an ``out`` checked with this very array: both were C-contiguous then, and the shape is the plan's)
        if plan is not None and (out is plan.checked_out and array is plan.checked_for
                                 if out is not None else array.flags.c_contiguous):
            return plan.allreduce(0, array, out)  # (a hot call: ``simipu.fabric.planned.PlannedPaths``)
    fabric = _backend.fabric or current_fabric()
    if type(array) is not _ndarray or array.dtype.kind not in _NUMERIC:  # (else ``_array`` would return it)
        array = _array(array)
    return fabric.allreduce(array, op if op is Sum else _op(op), _backend.groups.members, out)


def allreduce_init(array: Any, op: str = Sum) -> Callable[[], Any]:
    """A persistent allreduce, as MPI 4's ``MPI_Allreduce_init``: bind ``array`` (a C-contiguous NumPy array)
    once, then each call of the returned function allreduces its current contents across the instances of the
    group current at binding (as an MPI persistent request keeps its communicator), with the same result, bit
    for bit, as ``allreduce(array, op)``, into one output array that it returns every time (the next call
    overwrites it). The plan, the checks and the output are made once. The array's memory is bound with the
    shape it has now: reshaping it in place later (``array.shape = ...``) changes nothing here."""
    import numpy as np

    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.dtype.isnative:
        raise ValueError("allreduce_init binds its array (each call reduces its current contents), so it takes a "
                         "C-contiguous numpy.ndarray in native byte order: pass np.ascontiguousarray(x) and keep it")
    fabric = _backend.fabric or current_fabric()
    init = getattr(fabric, "allreduce_init", None)
    x, op, group = _array(array).view(), _op(op), _backend.groups.members  # (a view: its shape stays this one)
    if init is not None:
        bound = init(x, op, group)
    else:
        out = np.empty_like(x)  # one instance, no fabric: each call copies the array

        def bound():
            np.copyto(out, fabric.allreduce(x, op, group))
            return out

    def persistent():
        if _backend.grouped and _backend.groups.members != group:
            _check_regrouped(group, _backend.groups.members, fabric.num_instances)
        return bound()
    return persistent


def _check_regrouped(bound: tuple[int, ...] | None, current: tuple[int, ...] | None, size: int) -> None:
    """A persistent allreduce called inside ``execute_on_instances`` of other instances than it was bound
    across refuses: it would wait for instances that are not calling it (or leave out some that are)."""
    if current is None or (bound or tuple(range(size))) == current:
        return  # (outside any group it spans the group it was bound across)
    across = "every instance" if bound is None else f"instances {list(bound)}"
    raise ValueError(f"this persistent allreduce was bound across {across} and is called inside "
                     f"execute_on_instances of instances {list(current)}: call allreduce_init inside the group it "
                     "is to reduce across (an MPI persistent request keeps its communicator)")


def grouped_allreduce(arrays: Iterable[Any], op: str = Sum) -> list:
    """Allreduce several arrays; the results come back in the same order."""
    return [allreduce(array, op) for array in arrays]


def broadcast(array: Any, root: int = 0, out: Any = None):
    """Every instance gets the root instance's array: a new one, or ``out`` filled (``out=array``: in place).
    A wrong ``out`` (dtype, shape, not C-contiguous) raises ValueError once the broadcast is done."""
    if type(array) is _ndarray and not _backend.grouped:  # (as ``allreduce``'s hot path)
        try:
            plan = _backend.hot_copies.get((root, array.dtype, array.shape))
        except TypeError:
            plan = None
        if plan is not None and (out is plan.checked_out and array is plan.checked_for
                                 if out is not None else array.flags.c_contiguous):
            return plan.allreduce(0, array, _empty_like(array) if out is None else out)
    fabric = _backend.fabric or current_fabric()
    if type(array) is not _ndarray or array.dtype.kind not in _NUMERIC:  # (as ``allreduce``: a call's Python is
        array = _array(array)  # most of a small collective's time)
    return fabric.broadcast(array, root if type(root) is int else _instance_index(root, "broadcast's root"),
                            _backend.groups.members, out)


def allgather(array: Any, out: Any = None):
    """Every instance's array, stacked in instance order: shape (instances, *shape); into ``out`` if given
    (that shape and the array's dtype, C-contiguous; a wrong one raises ValueError once the call is done)."""
    if out is not None and type(array) is _ndarray and not _backend.grouped:  # (as ``allreduce``'s hot path)
        plan = _backend.hot_copies.get((-1, array.dtype, array.shape))
        if plan is not None and out is plan.checked_out and array is plan.checked_for:
            return plan.allreduce(0, array, out)
    fabric = _backend.fabric or current_fabric()
    if type(array) is not _ndarray or array.dtype.kind not in _NUMERIC:  # (as ``allreduce``)
        array = _array(array)
    return fabric.allgather(array, _backend.groups.members, out)


def reduce_scatter(array: Any, op: str = Sum):
    """Reduce across instances, and give instance k the k-th of equal parts along axis 0."""
    return current_fabric().reduce_scatter(_array(array), _op(op), current_group())


def barrier() -> None:
    """Return only once every instance (of the current group) has called it."""
    current_fabric().barrier(current_group())


def synchronize() -> None:
    """PopDist's barrier across instances."""
    barrier()


def execute_on_instances(instances: Iterable[int], func: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run ``func`` on the named instances only (None elsewhere).

    Collectives inside ``func`` span only those instances, e.g. a checkpoint
    saved by instance 0 alone: ``execute_on_instances({0}, save, model)``.
    Nested inside another, it may name only instances of the enclosing one.
    """
    members = tuple(sorted({_instance_index(i, 'execute_on_instances: each instance') for i in instances}))
    count = core.getNumInstances()
    bad = [i for i in members if not 0 <= i < count]
    if bad:
        raise ValueError(f"execute_on_instances: instances {bad} do not exist (0 to {count - 1})")
    _check_within_enclosing(members, current_group())
    if core.getInstanceIndex() not in members:
        return None
    with instance_group(members):
        return func(*args, **kwargs)


def _check_within_enclosing(members: tuple[int, ...], enclosing: tuple[int, ...] | None) -> None:
    """Inside ``execute_on_instances`` of ``enclosing``, the instances outside it never run the nested call: its
    collectives would wait for them (then fail late, naming other calls). Every member of the enclosing group
    that reaches the nested call raises at once instead, whether or not it is among ``members``."""
    if enclosing is None:
        return
    outside = [i for i in members if i not in enclosing]
    if outside:
        raise ValueError(f"execute_on_instances({list(members)}) inside execute_on_instances({list(enclosing)}): "
                         f"instances {outside} are outside the enclosing group, so they never run it; name only "
                         "instances of the enclosing group, or call it outside that group")


def _instance_index(value: Any, what: str) -> int:
    """``value`` as an instance index: an integer, NumPy's too; 1.5 or "1" is refused, where ``int()`` truncated
    or parsed it into some instance."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an instance index (an integer), got {value!r}") from None


def rank() -> int:
    """This instance's index: the fabric's, once it is connected (reading the launch from the environment, as
    ``popdist.getInstanceIndex`` does, takes ~25 us: too much for a call made on every step)."""
    fabric = _backend.fabric
    return core.getInstanceIndex() if fabric is None else fabric.instance


def size() -> int:
    """The instances of the job: the fabric's, once it is connected (as ``rank``)."""
    fabric = _backend.fabric
    return core.getNumInstances() if fabric is None else fabric.num_instances


def local_rank() -> int:
    return core.getLocalInstanceIndex()


def local_size() -> int:
    launch = core._launch()
    return 1 if launch is None else launch.num_local_instances


