"""Broadcast and allgather benchmark: poprun-py's collectives fabric against mpi4py and torch gloo.

The allreduce benchmark's method (``benchmarks/allreduce.py``: the same workers,
launches, rounds, checks and plans) applied to two more collectives, float32,
N = 2 and 4 processes on this one host, results of 4 KiB, 256 KiB, 4 MiB and 64 MiB:

* broadcast from root 0: ``popdist.collectives.broadcast(x, 0, out=x)`` under
  ``poprun --offline-mode=1 --num-instances N --num-replicas N``, against
  ``comm.Bcast(x, root=0)`` (mpi4py under ``mpirun``) and ``dist.broadcast(t, src=0)``
  (torch gloo under ``torchrun``), all three in place;
* allgather: ``popdist.collectives.allgather(x, out=out)`` against ``comm.Allgather(x, out)``,
  each into a preallocated ``out``, and ``dist.all_gather(rows, t)`` into views of one
  preallocated array. The size is the gathered result's, as NCCL's tests count
  it: each process contributes size / N bytes.

Every result is checked element by element before and after the timed calls. Bus
bandwidth follows NCCL's tests: broadcast ``busbw = algbw``, allgather
``busbw = algbw * (N-1)/N``. Target (issue 19): poprun's latency at most 1.2x
mpi4py's at every size.

Run it with the project's interpreter (the anchors are installed as for
``allreduce.py`` unless ``--skip-install``)::

    .venv/bin/python benchmarks/collectives.py                 # both, full: about 2-3 minutes each
    .venv/bin/python benchmarks/collectives.py --quick         # one round, fewer iterations
    .venv/bin/python benchmarks/collectives.py --collective broadcast --tools poprun,mpi4py

Plain tables go to stdout; everything also goes to ``benchmarks/results/broadcast.json``
and ``allgather.json`` (and a PNG beside each, if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allreduce import (  # noqa: E402  (the allreduce benchmark's launches, cells and formats)
    FULL_PLAN,
    FULL_ROUNDS,
    NS,
    QUICK_PLAN,
    QUICK_ROUNDS,
    SIZES,
    Cell,
    bench,
    cell_text,
    div,
    fabric_fingerprint,
    find_anchors,
    fmt_ratio,
    fmt_size,
    json_report,
    spread_table,
    state_table,
)
from launch import (  # noqa: E402
    CORES,
    RESULTS_DIR,
    format_table,
    git_state,
    say,
)

COLLECTIVES = ("broadcast", "allgather")
TOOLS = ("poprun", "mpi4py", "gloo")
ANCHORS = ("mpi4py", "gloo")
TARGET_RATIO = 1.2  # poprun's latency over mpi4py's, at every size


def metric_table(cells: dict[tuple, Cell], tools: list[str], metric: str) -> str:
    """Rows (N, size); a column per tool, then poprun over each anchor."""
    digits = {"median_us": 1, "busbw": 3}[metric]
    rows = []
    for n in NS:
        for nbytes in SIZES:
            got = {t: cells.get((t, n, nbytes)) for t in TOOLS}
            values = {t: (getattr(c, metric) if c else None) for t, c in got.items()}
            rows.append([n, fmt_size(nbytes)] + [cell_text(got[t], values[t], digits) for t in TOOLS]
                        + [fmt_ratio(div(values["poprun"], values[a])) for a in ANCHORS])
    headers = ["N", "size", *TOOLS, "poprun/mpi4py", "poprun/gloo"]
    return format_table(headers, rows, "r" * len(headers))


def targets(cells: dict[tuple, Cell], collective: str) -> list[tuple[str, bool | None, str]]:
    """poprun's latency at most ``TARGET_RATIO`` x mpi4py's per (N, size); and every result right."""
    out: list[tuple[str, bool | None, str]] = []
    for n in NS:
        for nbytes in SIZES:
            mine, anchor = cells.get(("poprun", n, nbytes)), cells.get(("mpi4py", n, nbytes))
            ratio = div(mine.median_us if mine else None, anchor.median_us if anchor else None)
            out.append((f"{collective} N={n} {fmt_size(nbytes)}: poprun <= {TARGET_RATIO}x mpi4py",
                        None if ratio is None else ratio <= TARGET_RATIO,
                        "not measured" if ratio is None else f"{ratio:.2f}x"))
    bad = [c for c in cells.values() if any("check" in p for p in c.problems)]
    out.append(("every result checked and right", not bad,
                "yes" if not bad else "; ".join(f"{c.tool} N={c.n} {fmt_size(c.nbytes)}" for c in bad)))
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collective", choices=(*COLLECTIVES, "both"), default="both", help="what to time")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations, one round (a rough look)")
    parser.add_argument("--skip-install", action="store_true",
                        help="do not install missing anchors (Open MPI, libopenmpi-dev, mpi4py, torch)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="where <collective>.json goes")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tools.split(",")) - set(TOOLS))
    if unknown:
        parser.error(f"--tools: unknown {', '.join(unknown)}; choose from {', '.join(TOOLS)}")
    return args


def run_one(collective: str, anchors: dict, tools: list[str], args: argparse.Namespace) -> None:
    """One collective: measure, print the tables and targets, write the JSON (and the PNG)."""
    started, load = time.perf_counter(), os.getloadavg()
    cells, launches = bench(anchors, tools, args.quick, collective)
    say(f"{collective}: 1. Median latency, us (each iteration: the slowest process)")
    say(metric_table(cells, tools, "median_us"))
    say(f"\n{collective}: 2. Bus bandwidth, GB/s (NCCL's convention)")
    say(metric_table(cells, tools, "busbw"))
    say(f"\n{collective}: 3. Spread: median of each round, instance 0's own median, fastest iteration (us)")
    say(spread_table(cells, tools))
    say(f"\n{collective}: 4. By the host's state: medians of the rounds' medians, us (rounds), near and far")
    say(state_table(cells, launches))
    for cell in cells.values():
        for problem in cell.problems[:2]:
            say(f"  {cell.tool} N={cell.n} {fmt_size(cell.nbytes)}: {problem[:300]}")
    rows = targets(cells, collective)
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    say(f"\n{collective}: targets")
    say(format_table(["target", "result", "measured"], [[t, verdict[ok], m] for t, ok, m in rows], "lll"))
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    say(f"({collective} took {elapsed:.0f} s; load average before {load[0]:.2f}, after {load_after[0]:.2f})\n")
    plan, rounds = (QUICK_PLAN, QUICK_ROUNDS) if args.quick else (FULL_PLAN, FULL_ROUNDS)
    report = json_report(anchors, fabric_fingerprint(), args.quick, plan, rounds, cells, launches, rows,
                         (elapsed, load, load_after))
    report["collective"] = collective
    path = args.output_dir / f"{collective}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    say(f"JSON: {path}")
    from plot import plot_after_run  # benchmarks/plot.py: the PNG beside the JSON, if matplotlib is installed

    plot_after_run(path, f"{collective}.json")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    anchors = find_anchors(args.skip_install)
    if anchors is None:
        return 2
    wanted = args.tools.split(",")
    tools = [t for t in TOOLS if t in wanted and anchors[t].path]
    git = git_state()
    say(f"poprun-py broadcast/allgather benchmark ({'quick' if args.quick else 'full'}), float32, {CORES} cores, "
        f"Python {sys.version.split()[0]}, commit {git['commit']}"
        + (" (src/ modified)" if git["src_modified"] == "yes" else "") + f", fabric sources {fabric_fingerprint()}")
    for key in TOOLS:
        a = anchors[key]
        say(f"  {key:7} {a.path + '  (' + a.version + ')' if a.path else 'SKIPPED: ' + a.note}")
    say()
    for collective in COLLECTIVES if args.collective == "both" else (args.collective,):
        run_one(collective, anchors, tools, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
