"""benchmarks/core_distance.py: the benchmarks' note of how far apart the two CPUs' caches are before each
launch. Its measurements fork a helper pinned to another CPU: the caller's affinity comes back, the helper is
gone afterwards, and a helper that dies mid-way makes a clear error, not a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import core_distance  # noqa: E402

two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin the pair on")


def children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


@two_cpus
def test_a_round_trip_is_measured_and_leaves_the_caller_as_it_was() -> None:
    affinity = os.sched_getaffinity(0)
    trip = core_distance.round_trip_ns(trips=2000)
    assert trip is not None and trip > 0
    assert os.sched_getaffinity(0) == affinity
    assert children() == []


@two_cpus
def test_the_copies_are_timed_with_and_without_the_other_cpu_reading() -> None:
    read = core_distance.copy_after_peer_read_us(calls=12, nbytes=64 * 1024)
    alone = core_distance.copy_after_peer_read_us(calls=12, peer_reads=False, nbytes=64 * 1024)
    assert read is not None and read > 0 and alone is not None and alone > 0
    assert children() == []


@two_cpus
def test_a_helper_that_dies_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_distance, "DEADLINE_S", 0.5)

    def wait_for_an_answer(words: np.ndarray, data: memoryview) -> float:
        words[0] = 1
        core_distance._wait(words, 2, time.monotonic() + core_distance.DEADLINE_S)
        return 0.0

    def die(words: np.ndarray, data: memoryview) -> None:
        os._exit(3)  # the helper leaves without answering
    with pytest.raises(core_distance.PeerGone, match="stopped answering"):
        core_distance._in_pinned_pair(wait_for_an_answer, die)
    assert children() == []


def test_a_bad_repeat_is_a_one_line_error() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "core_distance.py"), "--repeat", "0"],
                          capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"--repeat must be at least 1" in done.stderr and b"Traceback" not in done.stderr
