"""Point-to-point benchmark: mpi4py's send/recv under poprun-py against Open MPI's, as a ping-pong.

One worker, ``allreduce_workers/pingpong_worker.py``, runs under both launchers:
``from mpi4py import MPI`` is poprun-py's under ``poprun --offline-mode=1
--num-instances 2 --num-replicas 2`` and Open MPI's under ``mpirun -np 2``.
Ranks 0 and 1 send a message back and forth: ``comm.send``/``comm.recv`` of a
small int (``obj``: pickled, as most mpi4py programs send), then
a 1 MiB float64 array (pickled too), and ``comm.Send``/``comm.Recv`` of 8 B, 4 KiB,
64 KiB and 1 MiB buffers. Every
reply is checked. A launch times blocks of round trips after a warm-up; a
block's one-way latency is half its mean round trip. Each round launches both
tools, the order alternating; the table gives, per size, the median over
rounds of each launch's median block, and poprun over mpi4py.

Run it with the project's interpreter (Open MPI and mpi4py are installed as
for ``allreduce.py`` unless ``--skip-install``)::

    .venv/bin/python benchmarks/messages.py            # 3 rounds, under a minute
    .venv/bin/python benchmarks/messages.py --quick    # 1 round, fewer blocks

The table goes to stdout, everything to ``benchmarks/results/messages.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allreduce import WORKERS, ensure_mpi4py  # noqa: E402
from launch import (  # noqa: E402
    CORES,
    RESULTS_DIR,
    Anchor,
    ensure_mpirun,
    find_poprun,
    fmt_ratio,
    format_table,
    git_state,
    mpirun_argv,
    note,
    poprun_argv,
    python_env,
    ratio,
    run_command,
    say,
)

SIZES = ("obj", "obj1048576", "8", "4096", "65536", "1048576")
TOOLS = ("poprun", "mpi4py")
FULL = {"rounds": 3, "blocks": 30, "per_block": 100}
QUICK = {"rounds": 1, "blocks": 10, "per_block": 50}
RUN_TIMEOUT = 120.0


def size_label(size: str) -> str:
    if size == "obj":
        return "int (pickled)"
    if size.startswith("obj"):
        return f"{size_label(size[3:])} array (pickled)"
    nbytes = int(size)
    return f"{nbytes // 1048576} MiB" if nbytes >= 1048576 else f"{nbytes // 1024} KiB" if nbytes >= 1024 \
        else f"{nbytes} B"


def tool_argv(tool: str, anchors: dict[str, Anchor], out: Path, blocks: int, per_block: int) -> list[str]:
    worker = [sys.executable, str(WORKERS / "pingpong_worker.py"), "--sizes", ",".join(SIZES), "--out", str(out),
              "--blocks", str(blocks), "--per-block", str(per_block)]
    if tool == "poprun":
        return poprun_argv(anchors["poprun"], 2) + worker
    return mpirun_argv(anchors["mpi4py"], 2) + worker


def bench(anchors: dict[str, Anchor], tools: list[str], plan: dict[str, int]) -> tuple[dict, list[str]]:
    """{(tool, size): [each round's median one-way us]}, and what went wrong."""
    medians: dict[tuple[str, str], list[float]] = {(t, s): [] for t in tools for s in SIZES}
    problems: list[str] = []
    env = {**python_env(), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="messages-bench-") as tmp:
        for rnd in range(plan["rounds"]):
            for tool in tools[rnd % len(tools):] + tools[:rnd % len(tools)]:
                out = Path(tmp) / f"{tool}-{rnd}.json"
                note(f"round {rnd + 1}/{plan['rounds']}: {tool}")
                argv = tool_argv(tool, anchors, out, plan["blocks"], plan["per_block"])
                _, code, tail = run_command(argv, env=env, timeout=RUN_TIMEOUT)
                if code != 0 or not out.exists():
                    problems.append(f"{tool} round {rnd + 1}: " + ("hung" if code is None else f"exit {code}")
                                    + ": " + " | ".join(tail.strip().splitlines()[-3:]))
                    continue
                for size in json.loads(out.read_text())["sizes"]:
                    medians[(tool, size["size"])].append(statistics.median(size["one_way_us"]))
                    problems.extend(f"{tool} round {rnd + 1} {size['size']}: {p}" for p in size["problems"])
    return medians, problems


def table(medians: dict[tuple[str, str], list[float]], tools: list[str]) -> tuple[str, list[dict]]:
    rows, summary = [], []
    for size in SIZES:
        mid = {t: statistics.median(medians[(t, size)]) if medians.get((t, size)) else None for t in TOOLS}
        r = ratio(mid["poprun"], mid["mpi4py"])
        rows.append([size_label(size)] + [f"{mid[t]:,.1f}" if mid[t] is not None else "n/a" for t in TOOLS]
                    + [fmt_ratio(r)])
        summary.append({"size": size, **{f"{t}_us": mid[t] for t in TOOLS}, "poprun_over_mpi4py": r,
                        "rounds_us": {t: medians.get((t, size), []) for t in tools}})
    headers = ["message", "poprun us", "mpi4py us", "poprun/mpi4py"]
    return format_table(headers, rows, "lrrr"), summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round, fewer blocks (a rough look)")
    parser.add_argument("--skip-install", action="store_true", help="do not install Open MPI or mpi4py")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "messages.json", help="where the JSON goes")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    poprun = find_poprun()
    if poprun.path is None:
        note(poprun.note)
        return 2
    anchors = {"poprun": poprun, "mpi4py": ensure_mpi4py(ensure_mpirun(args.skip_install), args.skip_install)}
    tools = [t for t in TOOLS if anchors[t].path]
    for skipped in (a for a in anchors.values() if a.path is None):
        note(skipped.note)
    plan = QUICK if args.quick else FULL
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    git = git_state()
    say(f"poprun-py point-to-point benchmark ({'quick' if args.quick else 'full'}): ping-pong between 2 ranks, "
        f"one-way latency, {CORES} cores, commit {git['commit']}" + (" (src modified)" if git["src_modified"] == "yes"
                                                                     else ""))
    medians, problems = bench(anchors, tools, plan)
    text, summary = table(medians, tools)
    load_after = os.getloadavg()[0]
    say(text)
    for problem in problems:
        say(f"  {problem}")
    say(f"({plan['rounds']} rounds in {time.perf_counter() - started:.0f} s; load average before {load_before:.2f}, "
        f"after {load_after:.2f})")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"git": git, "quick": args.quick, "plan": plan, "cores": CORES,
                                       "anchors": {k: a.version or a.note for k, a in anchors.items()},
                                       "load_average": [load_before, load_after], "sizes": summary,
                                       "problems": problems}, indent=1))
    say(f"JSON: {args.output}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
