"""NUMA placement: instances of a host bound to its NUMA nodes round-robin (or, as mpirun's ``--bind-to
core`` and ``hwthread``, each to one core or one hardware thread of them).

The topology is read from sysfs (``<root>/devices/system/node/node*/cpulist``);
the root is injectable (``POPRUN_SYSFS_ROOT``) so tests can describe a 2- or
4-node machine. Only the CPUs of the cpuset poprun runs in are used, and a
node with none of them is skipped, as Graphcore's poprun does with cpusets.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, TypeVar, overload

log = logging.getLogger("poprun.numa")

SYSFS_ROOT_VARIABLE = "POPRUN_SYSFS_ROOT"
_NODE = re.compile(r"node(\d+)$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class NumaNode:
    index: int
    cpus: tuple[int, ...]


class Repeating(Sequence[_T]):
    """``length`` items that repeat ``round`` over and over: a placement as long as a host's instances, held in
    the memory of one round of its nodes and units."""

    def __init__(self, one_round: Sequence[_T], length: int) -> None:
        self.round = one_round
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(self._length))]
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return self.round[index % self._length % len(self.round)]


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` -> (0, 1, 2, 3, 8, 10, 11), the kernel's cpulist format."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(sorted(set(cpus)))


def _node_number(name: str) -> int:
    """``nodeN`` -> N; -1 for anything else in the directory."""
    match = _NODE.match(name)
    return int(match.group(1)) if match else -1


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def read_numa_nodes(sysfs_root: str | os.PathLike[str] = "/sys") -> tuple[NumaNode, ...]:
    """The machine's NUMA nodes; one node with every CPU when sysfs does not say."""
    base = os.path.join(sysfs_root, "devices", "system", "node")  # (os.path: a launch does without pathlib)
    nodes = []
    try:
        entries = sorted(os.listdir(base), key=_node_number)
    except OSError:
        entries = []
    for entry in entries:
        match = _NODE.match(entry)
        if not match:
            continue
        try:
            cpus = parse_cpulist(_read(os.path.join(base, entry, "cpulist")))
        except (OSError, ValueError):
            continue
        nodes.append(NumaNode(int(match.group(1)), cpus))
    return tuple(nodes) or (NumaNode(0, tuple(range(os.cpu_count() or 1))),)


def read_core_siblings(cpus: Iterable[int], sysfs_root: str | os.PathLike[str] = "/sys") -> dict[int, tuple[int, ...]]:
    """Each CPU's core: the hardware threads it shares a core with, itself included (sysfs's
    ``thread_siblings_list``); a CPU sysfs does not describe is a core of its own."""
    base = os.path.join(sysfs_root, "devices", "system", "cpu")
    siblings = {}
    for cpu in cpus:
        try:
            siblings[cpu] = parse_cpulist(_read(os.path.join(base, f"cpu{cpu}", "topology", "thread_siblings_list")))
        except (OSError, ValueError):
            siblings[cpu] = (cpu,)
    return siblings


def place(num_instances: int, nodes: Sequence[NumaNode], allowed: Iterable[int], unit: str | None = None,
          siblings: Mapping[int, tuple[int, ...]] | None = None) -> Repeating[tuple[NumaNode, tuple[int, ...]]]:
    """Node and CPUs for each of a host's instances, round-robin over the nodes with allowed CPUs. With a
    ``unit`` (mpirun's ``--bind-to``), each gets one of its node's units in turn, round-robin again once every
    unit has an instance: ``"hwthread"`` one CPU, ``"core"`` one core's allowed CPUs (``siblings``: each CPU's
    hardware threads; none given: every CPU a core).

    The placement repeats once every node and unit has had its turn: only that round is made, so a dry run of
    a million instances on a host holds a round of CPUs, not a million."""
    allowed_set = set(allowed)
    usable = [(node, tuple(c for c in node.cpus if c in allowed_set)) for node in nodes]
    usable = [(node, cpus) for node, cpus in usable if cpus]
    if not usable:
        raise ValueError(f"no NUMA node has any of the CPUs poprun may use ({sorted(allowed_set)})")
    if unit is None:
        return Repeating([usable[k % len(usable)] for k in range(min(num_instances, len(usable)))], num_instances)
    units = {node.index: _units(cpus, unit, siblings or {}) for node, cpus in usable}
    period = len(usable) * math.lcm(*(len(found) for found in units.values()))
    placed = [usable[k % len(usable)][0] for k in range(min(num_instances, period))]
    return Repeating([(node, units[node.index][(k // len(usable)) % len(units[node.index])])
                      for k, node in enumerate(placed)], num_instances)


def _units(cpus: tuple[int, ...], unit: str, siblings: Mapping[int, tuple[int, ...]]) -> list[tuple[int, ...]]:
    """A node's allowed ``cpus`` as binding units, in CPU order: one each, or one per core."""
    if unit == "hwthread":
        return [(cpu,) for cpu in cpus]
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in cpus:
        cores.setdefault(siblings.get(cpu, (cpu,)), []).append(cpu)
    return [tuple(members) for members in cores.values()]


def local_placement(num_instances: int, unit: str | None = None,
                    overload_allowed: bool = False) -> Repeating[tuple[NumaNode, tuple[int, ...]]]:
    """Placement on this host: sysfs (or the injected root) and the launcher's own cpuset. Cores or threads
    shared under ``--bind-to`` are said once, as Open MPI refuses them without ``overload-allowed``: with more
    instances than cores, unbound instances share them better (the scheduler moves them apart)."""
    allowed = os.sched_getaffinity(0)
    root = os.environ.get(SYSFS_ROOT_VARIABLE, "/sys")
    siblings = read_core_siblings(allowed, root) if unit == "core" else None
    placed = place(num_instances, read_numa_nodes(root), allowed, unit, siblings)
    units_used = len({cpus for _, cpus in placed.round})
    if unit is not None and not overload_allowed and num_instances > units_used:
        noun = "core" if unit == "core" else "CPU"
        log.warning("--bind-to %s: %d instances on %d %s%s here, so some share one (Open MPI refuses this without "
                    "--bind-to %s:overload-allowed); leave --bind-to out to let them move", unit, num_instances,
                    units_used, noun, "" if units_used == 1 else "s", unit)
    return placed
