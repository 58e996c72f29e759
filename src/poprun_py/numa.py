"""NUMA placement: instances of a host bound to its NUMA nodes round-robin (or, as mpirun's ``--bind-to
core``, each to one CPU of them).

The topology is read from sysfs (``<root>/devices/system/node/node*/cpulist``);
the root is injectable (``POPRUN_SYSFS_ROOT``) so tests can describe a 2- or
4-node machine. Only the CPUs of the cpuset poprun runs in are used, and a
node with none of them is skipped, as Graphcore's poprun does with cpusets.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

log = logging.getLogger("poprun.numa")

SYSFS_ROOT_VARIABLE = "POPRUN_SYSFS_ROOT"
_NODE = re.compile(r"node(\d+)$")


@dataclass(frozen=True)
class NumaNode:
    index: int
    cpus: tuple[int, ...]


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` -> (0, 1, 2, 3, 8, 10, 11), the kernel's cpulist format."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(sorted(set(cpus)))


def _node_number(entry: Path) -> int:
    """``nodeN`` -> N; -1 for anything else in the directory."""
    match = _NODE.match(entry.name)
    return int(match.group(1)) if match else -1


def read_numa_nodes(sysfs_root: str | os.PathLike[str] = "/sys") -> tuple[NumaNode, ...]:
    """The machine's NUMA nodes; one node with every CPU when sysfs does not say."""
    base = Path(sysfs_root) / "devices" / "system" / "node"
    nodes = []
    try:
        entries = sorted(base.iterdir(), key=_node_number)
    except OSError:
        entries = []
    for entry in entries:
        match = _NODE.match(entry.name)
        if not match:
            continue
        try:
            cpus = parse_cpulist((entry / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        nodes.append(NumaNode(int(match.group(1)), cpus))
    return tuple(nodes) or (NumaNode(0, tuple(range(os.cpu_count() or 1))),)


def place(num_instances: int, nodes: Sequence[NumaNode], allowed: Iterable[int],
          per_core: bool = False) -> list[tuple[NumaNode, tuple[int, ...]]]:
    """Node and CPUs for each of a host's instances, round-robin over the nodes with allowed CPUs; with
    ``per_core`` (mpirun's ``--bind-to core``) one CPU each, the node's next, round-robin again once every
    allowed CPU has an instance."""
    allowed_set = set(allowed)
    usable = [(node, tuple(c for c in node.cpus if c in allowed_set)) for node in nodes]
    usable = [(node, cpus) for node, cpus in usable if cpus]
    if not usable:
        raise ValueError(f"no NUMA node has any of the CPUs poprun may use ({sorted(allowed_set)})")
    placed = [usable[k % len(usable)] for k in range(num_instances)]
    if not per_core:
        return placed
    return [(node, (cpus[(k // len(usable)) % len(cpus)],)) for k, (node, cpus) in enumerate(placed)]


def local_placement(num_instances: int, per_core: bool = False,
                    overload_allowed: bool = False) -> list[tuple[NumaNode, tuple[int, ...]]]:
    """Placement on this host: sysfs (or the injected root) and the launcher's own cpuset. Cores shared by
    ``--bind-to core`` are said once, as Open MPI refuses them without ``overload-allowed``: with more
    instances than CPUs, unbound instances share them better (the scheduler moves them apart)."""
    allowed = os.sched_getaffinity(0)
    placed = place(num_instances, read_numa_nodes(os.environ.get(SYSFS_ROOT_VARIABLE, "/sys")), allowed, per_core)
    cpus_used = len({cpus for _, cpus in placed})
    if per_core and not overload_allowed and num_instances > cpus_used:
        log.warning("--bind-to core: %d instances on %d CPU%s here, so some share a CPU (Open MPI refuses this "
                    "without --bind-to core:overload-allowed); leave --bind-to out to let them move", num_instances,
                    cpus_used, "" if cpus_used == 1 else "s")
    return placed
