"""The benchmarks' poprun-launched workers, as benchmarks/collectives.py and allreduce.py launch them: each
collective they time is checked element by element, and they report the timings per size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support import run_poprun

WORKERS = Path(__file__).resolve().parent.parent / "benchmarks" / "allreduce_workers"
WORKER = WORKERS / "poprun_worker.py"
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


def test_the_hvd_worker_times_the_plain_call_beside_its_own(tmp_path: Path) -> None:
    """hvd's like for like, the plain allreduce on the same bytes, timed in blocks alternating with
    ``hvd.allreduce`` in the same processes: as many samples of each, both checked."""
    pytest.importorskip("torch")
    out = tmp_path / "result.json"
    done = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", sys.executable,
                      str(WORKERS / "hvd_worker.py"), "--plan", "4096:2:45,262144:1:3", "--out", str(out))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    for size in json.loads(out.read_text())["sizes"]:
        assert size["problems"] == {}, size["problems"]
        assert len(size["max_us"]) == len(size["paired_max_us"]) == len(size["paired_rank0_us"]) == size["iters"]
        assert min(size["paired_max_us"]) > 0


def test_the_poprun_worker_times_the_persistent_call_beside_the_call_into_out(tmp_path: Path) -> None:
    """With ``--label poprun`` (allreduce.py's ``poprun`` launch) the worker times the persistent allreduce
    (``allreduce_init``) in blocks alternating with its call into ``out``: as many samples of each, on the board's
    path (4 KiB) and shared memory's (256 KiB); other labels time one call."""
    for label, paired in (("poprun", True), ("poprun-new", False)):
        out = tmp_path / f"{label}.json"
        done = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", sys.executable,
                          str(WORKER), "--plan", "4096:2:45,262144:1:3", "--out", str(out), "--label", label)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        for size in json.loads(out.read_text())["sizes"]:
            assert size["problems"] == {}, size["problems"]
            assert ("paired_max_us" in size) is paired
            if paired:
                assert len(size["max_us"]) == len(size["paired_max_us"]) == size["iters"]
                assert min(size["paired_max_us"]) > 0


def test_the_pingpong_worker_checks_every_reply_of_each_size(tmp_path: Path) -> None:
    """benchmarks/messages.py's worker under poprun (mpi4py's point to point over the fabric): one-way latencies
    for each size, every reply right."""
    out = tmp_path / "result.json"
    done = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", sys.executable,
                      str(WORKERS / "pingpong_worker.py"), "--sizes", "obj,obj65544,8,1048576", "--warmup", "2",
                      "--blocks", "3", "--per-block", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    report = json.loads(out.read_text())
    assert report["library"] == "poprun-py fabric (no MPI library)"
    assert [size["size"] for size in report["sizes"]] == ["obj", "obj65544", "8", "1048576"]
    for size in report["sizes"]:
        assert size["problems"] == [] and len(size["one_way_us"]) == 3 and min(size["one_way_us"]) > 0
