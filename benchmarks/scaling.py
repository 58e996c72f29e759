"""Scaling benchmark: samples/s of examples/train.py on 1 and 2 instances of this host, and where a step goes.

What it measures: ``examples/train.py`` launched by
``poprun --num-instances N --num-replicas N`` (one replica per instance; a
partition from the embedded V-IPU, as the main job) for N = 1 and 2, with a
fixed batch *per replica*, so the global batch grows with N (weak scaling, as
data-parallel throughput is usually quoted). Two networks:

* ``main``: the main job's network (64-64-10), 32 samples per replica: each
  step is a few small matrix products, so fixed costs dominate;
* ``wide``: 64-1024-10, 256 samples per replica: each step does ~100x the
  arithmetic, and the gradient allreduce carries 75,000 float64 values.

From instance 0's ``--metrics-json``: samples/s of the training loops (every
replica's samples over the loops' wall time; start-up, evaluation and
checkpointing excluded), and the time spent inside ``cross_replica_sum``
(sending, reducing and waiting for the slowest replica) as a share of each
step. Derived: speed-up = samples/s(2) / samples/s(1) and scaling efficiency
= speed-up / 2; "computing" is the rest of a step (forward, backward, update):
it stays flat only if every instance has a core to itself. The whole launch's
wall time is recorded too.

Every run gets OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=1: one
core per instance, so one instance cannot already use both cores through
BLAS threads. Rounds run every (network, N) once, in an order that rotates
from round to round, so that noise from other jobs hits all alike; the
tables give medians over rounds.

    .venv/bin/python benchmarks/scaling.py            # 7 rounds, about a minute
    .venv/bin/python benchmarks/scaling.py --quick    # 3 rounds

Plain tables go to stdout; everything, every run included, also goes to
``benchmarks/results/scaling.json``.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
TRAIN = ROOT / "examples" / "train.py"
CORES = os.cpu_count() or 1
INSTANCES = (1, 2)
RUN_TIMEOUT = 300
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Network:
    name: str
    hidden: int
    per_replica: int  # samples per replica per step
    epochs: int


NETWORKS = (Network("main", 64, 32, 10), Network("wide", 1024, 256, 20))


@dataclass
class Run:
    network: str
    instances: int
    round: int
    wall_s: float
    samples_per_s: float
    train_s: float
    steps: int
    step_ms: float
    collective_ms: float
    collective_share: float
    test_accuracy: float


def launch(network: Network, instances: int, rnd: int, scratch: Path) -> Run:
    metrics = scratch / f"{network.name}-{instances}-{rnd}.json"
    argv = [str(Path(sys.executable).parent / "poprun"), "--num-instances", str(instances),
            "--num-replicas", str(instances), sys.executable, str(TRAIN), "--hidden", str(network.hidden),
            "--batch-size", str(network.per_replica * instances), "--epochs", str(network.epochs),
            "--checkpoint", "", "--progress", "off", "--metrics-json", str(metrics)]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT, env={**os.environ, **ONE_THREAD})
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr.decode()[-2000:]}")
    m = json.loads(metrics.read_text())
    steps = round(m["samples"] / (network.per_replica * instances))
    return Run(network.name, instances, rnd, wall, m["samples_per_second"], m["train_seconds"], steps,
               1e3 * m["step_seconds"] / steps, 1e3 * m["collective_seconds"] / steps, m["collective_share"],
               m["test_accuracy"])


def median(runs: list[Run], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def table(runs: list[Run]) -> tuple[str, list[dict[str, Any]]]:
    rows, summary = [], []
    header = ("| network | instances | global batch | samples/s | speed-up | efficiency | step | computing "
              "| in collectives | share | launch wall |")
    rows += [header, "|---" * (header.count("|") - 1) + "|"]
    for network in NETWORKS:
        base = None
        for n in INSTANCES:
            mine = [r for r in runs if r.network == network.name and r.instances == n]
            rate = median(mine, "samples_per_s")
            base = rate if n == 1 else base
            speedup = rate / base if base else None
            row = {"network": network.name, "instances": n, "global_batch": network.per_replica * n,
                   "samples_per_s": rate, "speedup": speedup, "efficiency": speedup / n if speedup else None,
                   "step_ms": median(mine, "step_ms"), "collective_ms": median(mine, "collective_ms"),
                   "collective_share": median(mine, "collective_share"), "wall_s": median(mine, "wall_s"),
                   "test_accuracy": median(mine, "test_accuracy")}
            summary.append(row)
            rows.append(f"| {network.name} (64-{network.hidden}-10) | {n} | {row['global_batch']} | {rate:,.0f} | "
                        f"{speedup:.2f}x | {100 * row['efficiency']:.0f}% | {row['step_ms']:.2f} ms | "
                        f"{row['step_ms'] - row['collective_ms']:.2f} ms | "
                        f"{row['collective_ms']:.2f} ms | {100 * row['collective_share']:.0f}% | {row['wall_s']:.2f} s |")
    return "\n".join(rows), summary


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src", "examples"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (modified)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "scaling.json", help="where the JSON goes")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = 3 if args.quick else 7
    commit, load = git_commit(), os.getloadavg()
    print(f"poprun-py scaling benchmark: examples/train.py, {rounds} rounds, {CORES} cores, "
          f"Python {sys.version.split()[0]}, commit {commit}; load average before {load[0]:.2f} (1 min)")
    cells = [(network, n) for network in NETWORKS for n in INSTANCES]
    runs: list[Run] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as state:
        os.environ.setdefault("XDG_STATE_HOME", state)  # the embedded V-IPU's state, unless the caller set one
        for rnd in range(rounds):
            for network, n in cells[rnd % len(cells):] + cells[:rnd % len(cells)]:
                runs.append(launch(network, n, rnd, Path(tmp)))
    text, summary = table(runs)
    print(text)
    load_after = os.getloadavg()
    print(f"(medians of {rounds} rounds; one replica per instance; took {time.perf_counter() - started:.0f} s; "
          f"load average after {load_after[0]:.2f})")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()), "cores": CORES,
        "python": sys.version.split()[0], "rounds": rounds,
        "loadavg_before": load, "loadavg_after": load_after, "networks": [asdict(n) for n in NETWORKS],
        "summary": summary, "runs": [asdict(r) for r in runs],
    }, indent=2) + "\n")
    print(f"JSON: {args.output}")
    from plot import plot_after_run  # benchmarks/plot.py: the PNG beside the JSON, if matplotlib is installed

    plot_after_run(args.output, "scaling.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
