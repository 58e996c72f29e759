"""benchmarks/replicas.py: the cross-replica benchmark launches its worker through poprun (2 replicas per
instance, on 1 and 2 instances), checks every sum it times, and reports this tree beside a baseline tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARK = ROOT / "benchmarks" / "replicas.py"


def test_the_replicas_benchmark_times_checked_sums_beside_a_baseline(tmp_path: Path) -> None:
    out = tmp_path / "replicas.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--rounds", "1", "--calls", "20", "--baseline", str(ROOT),
                           "--sizes", "4096", "38504", "--output", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(row["instances"], row["bytes"]) for row in report["summary"]] == [(1, 4096), (1, 38504), (2, 4096),
                                                                              (2, 38504)]
    for row in report["summary"]:
        assert len(row["poprun"]) == len(row["baseline"]) == 1 and min(row["poprun"] + row["baseline"]) > 0
    assert "| 2 x 2 | 38 KiB |" in done.stdout  # the table, with the baseline's columns
    assert "poprun/baseline" in done.stdout


def test_a_baseline_without_sources_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARK), "--baseline", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and f"--baseline {tmp_path}: no src/simipu in it" in done.stderr
