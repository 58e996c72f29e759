"""The collectives the fabric tests sweep, with their inputs and NumPy references.

Imported by the worker (which runs each case on the fabric) and by the test
(which computes what every instance must get). Inputs depend only on the
case, the instance and the dtype, so both sides build the same ones. The
expected allreduce results depend on the host layout (``hosts``: each
instance's host label, or None for one host): the fabric reduces within each
host first when a group spans several hosts and one holds several members.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

DTYPES = ("float32", "float64", "int32", "int64", "uint8", "float16")
OPS = ("sum", "mean", "max", "min", "prod")
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def make_input(name: str, instance: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose sums depend on the order of addition (for floats), fixed by name and instance."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), instance])
    kind = np.dtype(dtype).kind
    if kind == "c":
        return (rng.uniform(0.5, 1.5, size=shape) + 1j * rng.uniform(-1, 1, size=shape)).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if kind == "f":
        values = rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 5, size=shape)
        if "prod" in name:
            values = rng.uniform(0.5, 1.5, size=shape)
        return values.astype(dtype)
    if kind == "u":
        return rng.integers(0, 256, size=shape).astype(dtype)
    low, high = (-3, 4) if "prod" in name else (-1000, 1000)
    return rng.integers(low, high, size=shape).astype(dtype)


Hosts = Optional[tuple[str, ...]]


def _fold(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    ufunc = _UFUNCS[op]
    out = arrays[0].copy()
    for other in arrays[1:]:
        out = ufunc(out, other)
    return np.asarray(out)


def reduce_in_order(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """((x0 op x1) op x2) ... as the fabric promises, then / n for mean."""
    out = _fold(op, arrays)
    if op == "mean":
        out = np.asarray(out / np.asarray(len(arrays), dtype=out.dtype))
    return out


def reduce_for_layout(op: str, members: tuple[int, ...], arrays: list[np.ndarray], hosts: Hosts) -> np.ndarray:
    """The fabric's order for ``members`` (arrays by member): flat, or within each host by index, then
    across hosts in the order of their lowest member, when the members span several hosts and one holds
    several of them."""
    by_host: dict[str, list[np.ndarray]] = {}
    for member, array in zip(members, arrays):
        by_host.setdefault("" if hosts is None else hosts[member], []).append(array)
    if len(by_host) == 1 or all(len(group) == 1 for group in by_host.values()):
        return reduce_in_order(op, arrays)
    out = _fold(op, [_fold(op, group) for group in by_host.values()])
    if op == "mean":
        out = np.asarray(out / np.asarray(len(arrays), dtype=out.dtype))
    return out


@dataclass(frozen=True)
class Case:
    """One collective call: what each member runs, and what each member must get."""

    name: str
    members: Callable[[int], tuple[int, ...]]  # n -> the group (all instances unless it is a group case)
    run: Callable[..., np.ndarray]  # (fabric, instance, n) -> result
    expect: Callable[[int, int, Hosts], np.ndarray]  # (instance, n, hosts) -> reference


def _everyone(n: int) -> tuple[int, ...]:
    return tuple(range(n))


def _allreduce(op: str, dtype: str, shape: tuple[int, ...], group: Callable[[int], tuple[int, ...]] = _everyone,
               tag: str = "") -> Case:
    name = f"allreduce-{op}-{dtype}-{'x'.join(map(str, shape))}{tag}"

    def run(fabric, instance: int, n: int) -> np.ndarray:
        g = group(n)
        return fabric.allreduce(make_input(name, instance, dtype, shape), op=op,
                                group=None if g == _everyone(n) else g)

    def expect(instance: int, n: int, hosts: Hosts) -> np.ndarray:
        return reduce_for_layout(op, group(n), [make_input(name, i, dtype, shape) for i in group(n)], hosts)

    return Case(name, group, run, expect)


def _noncontiguous(n: int) -> Case:
    name = "allreduce-noncontiguous"

    def source(instance: int) -> np.ndarray:
        return make_input(name, instance, "float64", (6, 8))[::2, ::3]

    def run(fabric, instance: int, n: int) -> np.ndarray:
        array = source(instance)
        assert not array.flags.c_contiguous
        before = array.copy()
        result = fabric.allreduce(array)
        assert np.array_equal(array, before), "allreduce modified its input"
        return result

    return Case(name, _everyone, run, lambda instance, n, hosts: reduce_for_layout(
        "sum", _everyone(n), [source(i) for i in range(n)], hosts))


def _byteswapped(n: int) -> Case:
    """Big-endian input: the fabric works (and answers) in native byte order."""
    name = "allreduce-bigendian"

    def run(fabric, instance: int, n: int) -> np.ndarray:
        return fabric.allreduce(make_input(name, instance, "float32", (5,)).astype(">f4"))

    return Case(name, _everyone, run, lambda instance, n, hosts: reduce_for_layout(
        "sum", _everyone(n), [make_input(name, i, "float32", (5,)) for i in range(n)], hosts))


def _broadcast(root: int, dtype: str, shape: tuple[int, ...]) -> Case:
    name = f"broadcast-{root}-{dtype}-{'x'.join(map(str, shape))}"
    return Case(name, _everyone,
                lambda fabric, instance, n: fabric.broadcast(make_input(name, instance, dtype, shape), root=root),
                lambda instance, n, hosts: make_input(name, root, dtype, shape))


def _allgather(dtype: str, shape: tuple[int, ...]) -> Case:
    name = f"allgather-{dtype}-{'x'.join(map(str, shape))}"
    return Case(name, _everyone,
                lambda fabric, instance, n: fabric.allgather(make_input(name, instance, dtype, shape)),
                lambda instance, n, hosts: np.stack([make_input(name, i, dtype, shape) for i in range(n)]))


def _reduce_scatter(op: str, dtype: str, rows_per_member: int, cols: int) -> Case:
    name = f"reduce_scatter-{op}-{dtype}-{rows_per_member}x{cols}"

    def run(fabric, instance: int, n: int) -> np.ndarray:
        return fabric.reduce_scatter(make_input(name, instance, dtype, (n * rows_per_member, cols)), op=op)

    def expect(instance: int, n: int, hosts: Hosts) -> np.ndarray:
        whole = reduce_in_order(op, [make_input(name, i, dtype, (n * rows_per_member, cols)) for i in range(n)])
        return whole[instance * rows_per_member:(instance + 1) * rows_per_member]

    return Case(name, _everyone, run, expect)


def _barrier(name: str) -> Case:
    def run(fabric, instance: int, n: int) -> np.ndarray:
        fabric.barrier()
        return np.zeros(0)

    return Case(name, _everyone, run, lambda instance, n, hosts: np.zeros(0))


def _pair(n: int) -> tuple[int, ...]:
    """A group of the first and last instance (the others skip the call)."""
    return (0, n - 1) if n > 1 else (0,)


def suite(n: int) -> list[Case]:
    """Every case for a job of n instances, in the order each instance runs them."""
    cases = [_allreduce(op, dtype, (4, 3)) for op in OPS for dtype in DTYPES
             if not (op == "mean" and np.dtype(dtype).kind in "iu")]
    cases += [_allreduce("sum", dtype, (0, 3)) for dtype in ("float32", "int64")]
    cases += [_allreduce("sum", "float32", ()), _noncontiguous(n), _byteswapped(n), _barrier("barrier-1")]
    cases += [_allreduce(op, "complex64", (3,)) for op in ("sum", "prod")]
    cases += [_allreduce("sum", "float32", (300_001,)), _allreduce("max", "int64", (70_000, 3)),
              _allreduce("mean", "float64", (3, 100_003))]  # the chunked algorithms, uneven chunks
    cases += [_allreduce("sum", "float32", (300_001,), tag="-again")]  # the same layout twice in a row
    cases += [_allreduce("sum", "float32", (20_000,), tag=f"-{k}") for k in range(3)]  # shared memory, whole
    cases += [_broadcast(root, "float32", (5, 2)) for root in range(n)]
    cases += [_broadcast(root, "int16", (1_000_003,)) for root in range(n)]  # scatter + allgather
    cases += [_broadcast(0, "float64", (0,)), _broadcast(n - 1, "bool", (9,))]
    cases += [_allgather("float64", (3, 2)), _allgather("uint8", (0,)), _allgather("int32", (200_000,))]
    cases += [_reduce_scatter("sum", "float32", 2, 3), _reduce_scatter("max", "int32", 1, 0),
              _reduce_scatter("sum", "float64", 40_000, 2)]
    cases += [_allreduce("sum", "float64", (7,), group=_pair, tag="-pair"),
              _allreduce("sum", "float32", (100_000,), group=_pair, tag="-pair"), _barrier("barrier-2")]
    assert len({case.name for case in cases}) == len(cases)
    return cases
