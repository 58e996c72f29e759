"""Small collectives beside busy processes: poprun-py's fabric against mpi4py, N = 2 on this host, with 0, 1
and 2 other processes spinning on the host's CPUs.

A laptop or a shared build machine rarely gives a job every CPU: an editor, a
compiler or another job holds some. On two CPUs, one busy process beside two
instances leaves three runnable tasks for two CPUs, and the kernel may keep the
two instances on one CPU for the whole run (its balancer sees two busy CPUs
either way). This runs ``K`` busy loops (``python -c "while True: pass"``, no
pinning) for the whole of each ``K``'s launches, and launches the allreduce
benchmark's workers (``allreduce_workers/``: poprun's ``popdist.collectives``
into ``out``, mpi4py's ``comm.Allreduce`` under ``mpirun``) in turn, the order
rotating, ``--rounds`` times each. Each figure is over every timed call of
every round: the slowest process's time a call, its median and its mean (the
mean counts the calls that waited for a CPU, which the median hides).

Run it with the project's interpreter (the anchors installed as for
``allreduce.py`` unless ``--skip-install``)::

    .venv/bin/python benchmarks/neighbours.py                       # allreduce, 4 KiB and 256 KiB: about a minute
    .venv/bin/python benchmarks/neighbours.py --collective allgather --busy 1

Plain tables go to stdout, everything also to ``benchmarks/results/neighbours-<collective>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allreduce import KIB, Cell, add_samples, find_anchors, plan_text, tool_argv  # noqa: E402
from launch import CORES, RESULTS_DIR, format_table, git_state, note, python_env, run_command, say  # noqa: E402

TOOLS = ("poprun", "mpi4py")
COLLECTIVES = ("allreduce", "broadcast", "allgather")  # (the workers' ``--collective``)
N = 2
#: bytes: (warm-up calls, timed calls) per launch
PLAN = {4 * KIB: (1000, 10000), 256 * KIB: (100, 2000)}
RUN_TIMEOUT = 300.0
BUSY_LOOP = "while True: pass"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collective", choices=COLLECTIVES, default="allreduce", help="the collective timed")
    parser.add_argument("--busy", default="0,1,2", help="comma-separated counts of busy loops (default: 0,1,2)")
    parser.add_argument("--rounds", type=int, default=4, help="launches of each tool per count (default: 4)")
    parser.add_argument("--skip-install", action="store_true",
                        help="do not install missing anchors (Open MPI, libopenmpi-dev, mpi4py)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="where neighbours-<collective>.json goes")
    args = parser.parse_args(argv)
    try:
        args.busy = [int(k) for k in args.busy.split(",")]
    except ValueError:
        parser.error(f"--busy: {args.busy!r} is not a comma-separated list of counts")
    if any(k < 0 for k in args.busy) or args.rounds < 1:
        parser.error("--busy counts must be 0 or more, and --rounds 1 or more")
    return args


def run_beside(busy: int, anchors: dict, tools: list[str], collective: str, rounds: int,
               cells: dict[tuple, Cell]) -> list[str]:
    """Every tool's ``rounds`` launches with ``busy`` loops spinning throughout; the failures, described."""
    env = {**python_env(), "OMP_NUM_THREADS": "1"}
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    failures: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="neighbours-bench-") as tmp:
            for rnd in range(rounds):
                first = rnd % len(tools)
                for tool in tools[first:] + tools[:first]:
                    note(f"{busy} busy, round {rnd + 1}/{rounds}: {tool}")
                    out = Path(tmp) / f"{tool}-{rnd}.json"
                    argv = tool_argv(tool, anchors, N, plan_text(PLAN), out, collective)
                    _, code, tail = run_command(argv, env=env, timeout=RUN_TIMEOUT)
                    if code != 0 or not out.exists():
                        failures.append(f"{tool}, {busy} busy, round {rnd + 1}: exit {code}: {tail.strip()[-300:]}")
                        continue
                    for size in json.loads(out.read_text())["sizes"]:
                        add_samples(cells.setdefault((tool, busy, size["bytes"]),
                                                     Cell(tool, N, size["bytes"], collective)), size, rnd)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return failures


def table(cells: dict[tuple, Cell], busy: list[int]) -> str:
    """Rows (busy loops, size): each tool's median and mean, and poprun over mpi4py for each."""
    rows = []
    for k in busy:
        for nbytes in PLAN:
            got = [cells.get((tool, k, nbytes)) for tool in TOOLS]
            medians = [statistics.median(c.max_us) if c and c.max_us else None for c in got]
            means = [statistics.fmean(c.max_us) if c and c.max_us else None for c in got]
            rows.append([k, f"{nbytes // KIB} KiB",
                         *(f"{m:.1f}" if m is not None else "-" for m in medians),
                         *(f"{m:.1f}" if m is not None else "-" for m in means),
                         *(f"{a / b:.2f}x" if a and b else "-" for a, b in ((medians[0], medians[1]),
                                                                           (means[0], means[1])))])
    headers = ["busy", "size", "poprun median", "mpi4py median", "poprun mean", "mpi4py mean",
               "median ratio", "mean ratio"]
    return format_table(headers, rows, "r" * len(headers))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    anchors = find_anchors(args.skip_install)
    if anchors is None:
        return 2
    tools = [t for t in TOOLS if anchors[t].path]
    git = git_state()
    say(f"poprun-py beside busy processes: {args.collective}, float32, N={N}, {CORES} cores, "
        f"Python {sys.version.split()[0]}, commit {git['commit']}"
        + (" (src/ modified)" if git["src_modified"] == "yes" else ""))
    started, load = time.perf_counter(), os.getloadavg()
    cells: dict[tuple, Cell] = {}
    failures = [f for k in args.busy for f in run_beside(k, anchors, tools, args.collective, args.rounds, cells)]
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    say("The slowest process's time a call, us, over every call of every round; poprun over mpi4py")
    say(table(cells, args.busy))
    for failure in failures:
        say(f"  FAILED: {failure}")
    say(f"(took {elapsed:.0f} s; load average before {load[0]:.2f}, after {load_after[0]:.2f})")
    path = args.output_dir / f"neighbours-{args.collective}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "commit": git["commit"], "collective": args.collective, "n": N, "rounds": args.rounds,
        "plan": plan_text(PLAN), "elapsed_s": elapsed, "load": [load[0], load_after[0]], "failures": failures,
        "cells": [{"tool": tool, "busy": k, "bytes": nbytes, "max_us": cell.max_us}
                  for (tool, k, nbytes), cell in sorted(cells.items())],
    }) + "\n")
    say(f"JSON: {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
