"""The collectives benchmark's poprun worker, as benchmarks/collectives.py launches it: each collective it
times is checked element by element, and it reports the timings per size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support import run_poprun

WORKER = Path(__file__).resolve().parent.parent / "benchmarks" / "allreduce_workers" / "poprun_worker.py"
#: bytes:warm-up:timed calls; 256 KiB takes the shared-memory paths, 4 KiB the small ones
PLAN = "4096:2:5,262144:1:3"


@pytest.mark.parametrize("collective", ["broadcast", "allgather"])
def test_the_poprun_worker_times_checked_broadcasts_and_allgathers(tmp_path: Path, collective: str) -> None:
    out = tmp_path / "result.json"
    done = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", sys.executable, str(WORKER),
                      "--plan", PLAN, "--out", str(out), "--collective", collective)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    report = json.loads(out.read_text())
    assert report["collective"] == collective and report["n"] == 2
    assert [size["bytes"] for size in report["sizes"]] == [4096, 262144]
    for size in report["sizes"]:
        assert size["problems"] == {}, size["problems"]  # every element of every checked result right
        assert len(size["max_us"]) == size["iters"] and min(size["max_us"]) > 0
