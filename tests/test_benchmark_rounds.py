"""benchmarks/allreduce.py's rounds: the two tools issue 19 compares get more of them in a full run, and each
round's median is kept beside the core round trip before its launch, so the tables can split them by the host's
state (its CPUs near or far apart)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import allreduce as bench  # noqa: E402


def test_a_full_run_gives_poprun_and_mpi4py_more_rounds_than_the_others() -> None:
    tools = ["poprun", "poprun-new", "hvd", "mpi4py", "gloo"]
    full = bench.rounds_of(tools, quick=False)
    assert full == {"poprun": bench.LATENCY_ROUNDS, "mpi4py": bench.LATENCY_ROUNDS, "poprun-new": bench.FULL_ROUNDS,
                    "hvd": bench.FULL_ROUNDS, "gloo": bench.FULL_ROUNDS}
    assert bench.LATENCY_ROUNDS > bench.FULL_ROUNDS
    assert set(bench.rounds_of(tools, quick=True).values()) == {bench.QUICK_ROUNDS}


def rounds(tool: str, medians: list[float], trips: list[float]) -> bench.Cell:
    cell = bench.Cell(tool, 2, 4096)
    for median, trip in zip(medians, trips):
        bench.add_samples(cell, {"max_us": [median], "rank0_us": [median], "problems": {}}, 0, trip)
    return cell


def test_the_state_table_compares_the_tools_within_each_state() -> None:
    # The far rounds (trip >= 1.35 x 400 ns) would decide a pooled median: here mpi4py drew two of three.
    cells = {("poprun", 2, 4096): rounds("poprun", [100, 110, 400], [400, 450, 800]),
             ("mpi4py", 2, 4096): rounds("mpi4py", [125, 500, 520], [420, 700, 810])}
    launches = [bench.Launch("poprun", 2, 0, "", 1.0, 0, core_round_trip_ns=t) for t in (400, 450, 800, 420, 700, 810)]
    table = bench.state_table(cells, launches, sizes=[4096])
    assert "at least 540 ns" in table
    row = next(line for line in table.splitlines() if "4 KiB" in line).split()
    # near: poprun median of (100, 110) over mpi4py's 125; far: 400 over median of (500, 520)
    assert row[3:] == ["105.0", "(2)", "125.0", "(1)", "0.84x", "400.0", "(1)", "510.0", "(2)", "0.78x"]


def test_the_state_table_says_so_when_no_round_trip_was_measured() -> None:
    cells = {("poprun", 2, 4096): rounds("poprun", [100], [None])}  # type: ignore[list-item]
    launches = [bench.Launch("poprun", 2, 0, "", 1.0, 0)]
    assert "no core round trips" in bench.state_table(cells, launches, sizes=[4096])
