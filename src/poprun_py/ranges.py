"""Short text for sets of numbers: instance indices in log lines, CPU lists in placements."""

from __future__ import annotations

from typing import Iterable


def consecutive_runs(values: Iterable[int]) -> list[list[int]]:
    """[5, 0, 1, 2] -> [[0, 1, 2], [5]]."""
    runs: list[list[int]] = []
    for value in sorted(values):
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return runs


def format_indices(indices: Iterable[int]) -> str:
    """0,1,2,5 -> '0-2, 5': instance indices for log lines (pairs stay '0, 1')."""
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in consecutive_runs(indices))


def counted(count: int, noun: str) -> str:
    """'1 instance', '2 instances': a count and its noun, singular for one (regular plurals only)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_seconds(seconds: float) -> str:
    """2.0 -> '2', 0.25 -> '0.25', 1e-320 -> '1e-320': the shortest text that reads back as the same number (as a
    user wrote it), where ``:g`` shows a tiny value's float rounding ('9.99989e-321')."""
    return repr(float(seconds)).removesuffix(".0")


def named_instances(indices: Iterable[int]) -> str:
    """'instance 0', 'instances 0-2, 5' ('no instances'): indices for log lines with the noun they need."""
    found = sorted(indices)
    if len(found) < 2:
        return f"instance {found[0]}" if found else "no instances"
    return f"instances {format_indices(found)}"


def format_cpus(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5', the kernel's cpulist format."""
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in consecutive_runs(cpus))
