"""The ``--print-topology`` table, drawn the way Graphcore's poprun drew it.

Users compare this table with the ones in their old logs, so the layout
follows the tables real poprun runs printed (``--print-topology``, in
Graphcore's PopRun and PopDist user guide,
https://docs.graphcore.ai/projects/poprun-user-guide/en/latest/):

```
 ===========================================
|              poprun topology              |
|===========================================|
| hosts     |           localhost           |
|-----------|-------------------------------|
| ILDs      |               0               |
|-----------|-------------------------------|
| instances |       0       |       1       |
|-----------|-------------------------------|
| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |
 -------------------------------------------
```

Every row splits the same replica columns into contiguous cells. A cell
spanning n columns is n column widths plus the n-1 bars between them wide,
and its label is centred with the odd space on the right.

Choices where the real tables give no example:

* Every label, the title included, gets at least one space either side.
  When one would not fit, all replica columns widen by the same amount, so
  the table stays regular (a one-replica table is therefore 17 wide, not 15).
* Host names widen the table only while it stays within a terminal line
  (80 characters), so ``localhost`` on one replica is still shown in full.
  Past that, every host cell shows ``host0``, ``host1``, ... and the full
  names follow the table as ``host0: full.name`` lines (all hosts at once,
  so the labels stay uniform).
* ILDs are equal contiguous blocks of replicas, drawn independently of
  the instance and host boundaries. When they do not nest (say 3 instances
  and 2 ILDs), an ILD boundary falls inside an instance cell; the table
  shows that as it is rather than refusing, since whether such a launch is
  allowed is the planner's decision, not the drawing's.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from poprun_py.hosts import distribute_instances

if TYPE_CHECKING:
    from .plan import Plan
    from .records import Placement

logger = logging.getLogger(__name__)

TITLE = "poprun topology"
LOCAL_HOST_LABEL = "localhost"
ROW_NAMES = ("hosts", "ILDs", "instances", "replicas")
HOST_NAMES_MAX_LINE = 80
"""Host names may widen the table up to this line length; longer ones become footnotes."""


@dataclass(frozen=True)
class TopologyRow:
    """One table row: its name and its cells, each (label, replica columns spanned)."""

    name: str
    cells: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.cells:
            raise ValueError(f"topology row {self.name!r} has no cells")
        for label, span in self.cells:
            if span < 1:
                raise ValueError(
                    f"cell {label!r} of topology row {self.name!r} spans {span} columns; "
                    "it must span at least 1"
                )

    @property
    def num_columns(self) -> int:
        return sum(span for _, span in self.cells)


def render_table(rows: Sequence[TopologyRow], title: str = TITLE) -> str:
    """Draw rows, top to bottom, as one table (no trailing newline)."""
    if not rows:
        raise ValueError("a topology table needs at least one row")
    num_columns = rows[0].num_columns
    for row in rows:
        if row.num_columns != num_columns:
            raise ValueError(
                f"topology row {row.name!r} spans {row.num_columns} columns but row "
                f"{rows[0].name!r} spans {num_columns}; every row must cover the same replicas"
            )
    left = _left_width(rows)
    width = column_width(rows, title)
    inner = left + 1 + _cell_width(num_columns, width)

    lines = [" " + "=" * inner, "|" + _centre(title, inner) + "|", "|" + "=" * inner + "|"]
    for index, row in enumerate(rows):
        if index:
            lines.append("|" + "-" * left + "|" + "-" * (inner - left - 1) + "|")
        cells = "|".join(_centre(label, _cell_width(span, width)) for label, span in row.cells)
        lines.append("| " + row.name.ljust(left - 2) + " |" + cells + "|")
    lines.append(" " + "-" * inner)
    return "\n".join(lines)


def column_width(rows: Sequence[TopologyRow], title: str = TITLE) -> int:
    """The width of one replica column: the narrowest giving every label a space either side."""
    width = 1
    for row in rows:
        for label, span in row.cells:
            width = max(width, _narrowest(len(label) + 2, span))
    # The title spans the left column, its bar and all replica columns.
    num_columns = rows[0].num_columns if rows else 1
    return max(width, _narrowest(len(title) + 2 - _left_width(rows) - 1, num_columns))


def topology_rows(
    hosts: Sequence[str], num_ilds: int, num_instances: int, num_replicas: int
) -> tuple[TopologyRow, ...]:
    """The hosts, ILDs, instances and replicas rows of a launch.

    Instances go to hosts and replicas to instances in equal contiguous
    blocks, as poprun places them; no hosts means this machine, shown as
    ``localhost``. Raises ValueError when a count does not divide evenly.
    """
    labels = tuple(hosts) or (LOCAL_HOST_LABEL,)
    for flag, count in (("--num-ilds", num_ilds), ("--num-replicas", num_replicas)):
        if count < 1:
            raise ValueError(f"{flag} {count} must be at least 1")
    per_host = len(distribute_instances(len(labels), num_instances)[0])
    if num_replicas % num_instances:
        raise ValueError(
            f"--num-replicas {num_replicas} cannot be divided evenly among "
            f"{num_instances} instances; use a multiple of {num_instances}"
        )
    if num_replicas % num_ilds:
        raise ValueError(
            f"--num-replicas {num_replicas} cannot be divided evenly among "
            f"{num_ilds} ILDs (--num-ilds); use a multiple of {num_ilds}"
        )
    per_instance = num_replicas // num_instances
    per_ild = num_replicas // num_ilds
    digits = len(str(num_replicas - 1))
    return (
        TopologyRow("hosts", tuple((label, per_host * per_instance) for label in labels)),
        TopologyRow("ILDs", tuple((str(ild), per_ild) for ild in range(num_ilds))),
        TopologyRow("instances", tuple((str(i), per_instance) for i in range(num_instances))),
        TopologyRow("replicas", tuple((str(r).ljust(digits), 1) for r in range(num_replicas))),
    )


def render_topology(hosts: Sequence[str], num_ilds: int, num_instances: int, num_replicas: int) -> str:
    """The whole ``--print-topology`` output: the table, then any full host names."""
    rows = topology_rows(hosts, num_ilds, num_instances, num_replicas)
    host_row, others = rows[0], rows[1:]
    blank_hosts = TopologyRow(host_row.name, tuple(("", span) for _, span in host_row.cells))
    natural = column_width((blank_hosts, *others))
    width = column_width(rows)
    line = _left_width(rows) + 3 + _cell_width(host_row.num_columns, width)
    if width == natural or line <= HOST_NAMES_MAX_LINE:
        return render_table(rows)

    logger.debug("Host names do not fit in the topology table; listing them after it")
    short = tuple((f"host{index}", span) for index, (_, span) in enumerate(host_row.cells))
    table = render_table((TopologyRow(host_row.name, short), *others))
    notes = [f"{short_label}: {label}" for (short_label, _), (label, _) in zip(short, host_row.cells)]
    return "\n".join([table, *notes])


def _cell_width(span: int, width: int) -> int:
    """A cell spanning `span` columns of `width` swallows the bars between them."""
    return span * width + span - 1


def _narrowest(needed: int, span: int) -> int:
    """The smallest column width w with span*w + span-1 >= needed."""
    return max(1, -(-(needed - (span - 1)) // span))


def _left_width(rows: Sequence[TopologyRow]) -> int:
    """The name column: a space, the longest name, a space (11 for the usual rows)."""
    return max((len(row.name) for row in rows), default=0) + 2


def _centre(label: str, width: int) -> str:
    """Centre with the odd space on the right, as the real tables do (str.center varies)."""
    extra = width - len(label)
    return " " * (extra // 2) + label + " " * (extra - extra // 2)


def print_plan_topology(plan: Plan, placement: Placement) -> None:
    """``--print-topology``: the table, then the CPUs of each instance bound to NUMA nodes, on stderr."""
    from .ranges import format_cpus

    table = render_topology([str(h) for h in plan.hosts], placement.num_ilds, placement.num_instances,
                            placement.num_replicas)
    lines = [table.rstrip("\n")]
    for instance in plan.instances:
        if instance.cpus is not None:
            lines.append(f"instance {instance.index} on {instance.host}: CPUs {format_cpus(instance.cpus)}")
        elif placement.numa_wanted and not instance.host.is_local:
            lines.append(f"instance {instance.index} on {instance.host}: CPUs chosen there by its agent "
                         "(its host's NUMA nodes; --vv shows them)")
    from .writers import write_own_output

    sys.stderr.flush()  # what went before it comes first
    write_own_output(2, "\n".join(lines) + "\n")
