"""Cross-replica benchmark: one ``cross_replica_sum`` of the replicas of an instance's threads, and of the job.

What it measures: ``replica.cross_replica_sum(g)`` on float64 arrays, as the
main job (``examples/train.py``) calls it once a step, with 2 replicas per
instance (one thread each) on 1 and on 2 instances of this host. A call
meets the instance's replicas (``simipu/replicas.py``), has replica 0 sum
them and allreduce the sum over the instances, and hands each replica a
copy. Each figure is replica 0 of instance 0's median time a call (it waits
for every replica of every instance, so its time is the op's), over
``--calls`` calls after a warm-up. Sizes: 4 KiB, the main job's 38 KiB of
gradients, and 1 MiB.

``--baseline DIR`` times a second poprun-py source tree (``DIR/src`` first
on ``PYTHONPATH``) beside this one, launch for launch, in an order that
rotates from round to round; the table then gives this tree over the
baseline, per round and the median. There is no external anchor: no other
launcher runs replicas as threads of one instance.

    .venv/bin/python benchmarks/replicas.py                        # 5 rounds, under a minute
    .venv/bin/python benchmarks/replicas.py --baseline /tmp/base   # before/after a change
    .venv/bin/python benchmarks/replicas.py --quick

Plain tables go to stdout; everything, every launch included, also goes to
``benchmarks/results/replicas.json``.
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
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch import RESULTS_DIR, baseline_env, find_poprun, git_state, python_env  # noqa: E402  (same conventions)

SIZES = (4096, 38_504, 1 << 20)  # bytes (38,504: the main job's 4,810 gradients and 3 counters, float64)
LOCAL_REPLICAS = 2
INSTANCES = (1, 2)
RUN_TIMEOUT = 120.0


def worker(sizes: Sequence[int], calls: int, out: Path) -> None:
    """Under poprun: time the calls on every replica; instance 0 writes replica 0's per-call median per size."""
    import numpy as np

    import popdist
    from popdist import replicas

    popdist.init()

    def body(replica: Any) -> dict[int, float]:
        medians = {}
        for nbytes in sizes:
            g = np.full(nbytes // 8, float(replica.index))
            expected = float(sum(range(replica.num_replicas)))
            for _ in range(max(50, calls // 10)):
                replica.cross_replica_sum(g)
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                total = replica.cross_replica_sum(g)
                times.append(time.perf_counter() - started)
            if total[0] != expected or total[-1] != expected:
                raise SystemExit(f"replica {replica.index}: the sum is {total[0]}, not {expected}")
            medians[nbytes] = statistics.median(times) * 1e6
        return medians

    results = replicas.run(body)
    if popdist.getInstanceIndex() == 0:
        out.write_text(json.dumps({str(k): v for k, v in results[0].items()}))


def launch(poprun: str, instances: int, source: Path | None, sizes: Sequence[int], calls: int) -> dict[str, float]:
    """One launch of the worker (``source``'s ``src/`` first on the path, if given); its per-size medians (µs),
    keyed by size."""
    env = baseline_env(source) if source is not None else python_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [poprun, "--offline-mode=1", "--num-instances", str(instances),
                "--num-replicas", str(instances * LOCAL_REPLICAS), sys.executable, __file__, "--worker",
                "--sizes", *map(str, sizes), "--calls", str(calls), "--out", str(out)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return json.loads(out.read_text())


def size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of fewer calls")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each launches every configuration once)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per size and launch")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="another poprun-py tree timed beside this one")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "replicas.json", help="where the JSON goes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.sizes, args.calls, args.out)
        return 0
    if args.baseline is not None and not (args.baseline / "src" / "simipu").is_dir():
        parser.error(f"--baseline {args.baseline}: no src/simipu in it")
    poprun = find_poprun()
    if poprun.path is None:
        raise SystemExit(poprun.note)
    rounds, calls = (2, 300) if args.quick else (args.rounds, args.calls)
    trees: dict[str, Path | None] = {"poprun": None, **({"baseline": args.baseline} if args.baseline else {})}
    configs = [(tree, n) for n in INSTANCES for tree in trees]
    started, load = time.perf_counter(), os.getloadavg()
    launches: list[dict[str, Any]] = []
    for r in range(rounds):
        for k in range(len(configs)):
            tree, n = configs[(k + r) % len(configs)]
            launches.append({"round": r, "tool": tree, "instances": n,
                             "median_us": launch(poprun.path, n, trees[tree], args.sizes, calls)})
    summary = []
    for n in INSTANCES:
        for nbytes in args.sizes:
            row: dict[str, Any] = {"instances": n, "bytes": nbytes}
            for tree in trees:
                row[tree] = [run["median_us"][str(nbytes)] for run in launches
                             if run["tool"] == tree and run["instances"] == n]
            summary.append(row)
    head = ["instances x replicas", "size", "poprun"] + (["baseline", "poprun/baseline, round by round", "median"]
                                                         if args.baseline else [])
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in summary:
        cells = [f"{row['instances']} x {LOCAL_REPLICAS}", size_label(row["bytes"]),
                 f"{statistics.median(row['poprun']):.1f} µs"]
        if args.baseline:
            ratios = [a / b for a, b in zip(row["poprun"], row["baseline"])]
            cells += [f"{statistics.median(row['baseline']):.1f} µs", " ".join(f"{x:.2f}" for x in ratios),
                      f"**{statistics.median(ratios):.2f}x**"]
        print("| " + " | ".join(cells) + " |")
    git = git_state()
    commit = git["commit"]
    elapsed, load_after = time.perf_counter() - started, os.getloadavg()
    report = {"commit": commit, "git": git, "baseline": str(args.baseline) if args.baseline else None, "rounds": rounds,
              "calls": calls, "elapsed_s": elapsed, "loadavg_before": load, "loadavg_after": load_after,
              "summary": summary, "launches": launches}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"\n{commit}: {elapsed:.0f} s, load average {load[0]:.2f} before, {load_after[0]:.2f} after; "
          f"JSON: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
