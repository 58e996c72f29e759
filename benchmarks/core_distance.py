"""How far apart two CPUs' caches are right now, and what that does to a copy into memory the other CPU read.

On this project's machine (a KVM guest with 2 vCPUs) the host sometimes runs
the two vCPUs next to each other and sometimes far apart, and the state lasts
seconds to minutes. Far apart, a cache line bounces between them in about
twice the time, and writing 4 MiB that the other CPU has just read (its
cached copies must be invalidated first) takes 4-7x as long. Every
shared-memory collective does such writes, ours and Open MPI's, so a
benchmark round that happens to run in that state reads 2-3x slower at
4 MiB, whichever tool it is. The allreduce and collectives benchmarks
record ``core_round_trip_ns`` (``round_trip_ns``) before each launch, so
that a slow round can be told apart from a slow tool.

    .venv/bin/python benchmarks/core_distance.py          # the round trip and the copies, once
    .venv/bin/python benchmarks/core_distance.py --repeat 20

Pure Python and NumPy: the round trip includes the interpreter's loop (about
300-450 ns near, 700 ns and more far here), which is enough to tell the two
states apart; it is no hardware latency figure.
"""

from __future__ import annotations

import argparse
import mmap
import os
import select
import signal
import statistics
import sys
import time
from typing import Callable, Iterator

import numpy as np

#: Ping-pong round trips per measurement: about 10-20 ms.
TRIPS = 20_000
#: The copies' size: a shared-memory collective's at 4 MiB.
COPY_BYTES = 4 << 20
#: Bound on any wait for the other process (it may have died).
DEADLINE_S = 10.0


class PeerGone(RuntimeError):
    """The helper process stopped answering."""


def _pair() -> tuple[int, int] | None:
    """Two CPUs this process may run on, or None if it has only one."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def _wait(words: np.ndarray, value: int, deadline: float) -> None:
    """Spin until ``words[0] == value``; raise ``PeerGone`` when the other side has left (``words[7]``, set by
    the parent when it is done) or after ``deadline``, both checked every 4096 spins."""
    spins = 0
    while words[0] != value:
        spins += 1
        if not spins & 4095 and (words[7] == -1 or time.monotonic() > deadline):
            raise PeerGone("the other process stopped answering")


def _in_pinned_pair(parent: Callable[[np.ndarray, memoryview], float],
                    child: Callable[[np.ndarray, memoryview], None], data_bytes: int = 0) -> float | None:
    """Run ``parent`` on one CPU and ``child`` in a forked process on another, sharing a control line and
    ``data_bytes`` of memory; the parent's affinity is restored and the child reaped whatever happens."""
    pair = _pair()
    if pair is None:
        return None
    shared = mmap.mmap(-1, 4096 + data_bytes)  # MAP_SHARED | MAP_ANONYMOUS: the child sees the same pages
    words = np.frombuffer(shared, np.int64, 8)
    data = memoryview(shared)[4096:]
    affinity = os.sched_getaffinity(0)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # (the child runs only this and leaves with os._exit: no atexit, no buffers of the parent's)
        code = 0
        try:
            os.sched_setaffinity(0, {pair[1]})
            child(words, data)
        except BaseException:
            code = 1
        os._exit(code)
    try:
        os.sched_setaffinity(0, {pair[0]})
        return parent(words, data)
    finally:
        os.sched_setaffinity(0, affinity)
        words[7] = -1  # (a child still waiting sees this and leaves: ``_wait``)
        _reap(pid)  # (the mapping goes with its last view: an error's traceback may still hold one)


def _reap(pid: int) -> None:
    """Wait for our child ``pid`` to leave, killing it if it has not within a second."""
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], 1.0)[0]:
            os.kill(pid, signal.SIGKILL)  # (our own child, not yet reaped: its pid cannot have been reused)
    finally:
        os.close(pidfd)
    os.waitpid(pid, 0)


def _serve(words: np.ndarray, steps: int, act: Callable[[int], None] | None = None) -> None:
    """The child's side of ``steps`` turns: wait for odd ``words[0]``, act, answer with the next even number."""
    deadline = time.monotonic() + DEADLINE_S
    for step in range(steps):
        _wait(words, 2 * step + 1, deadline)
        if act is not None:
            act(step)
        words[0] = 2 * step + 2


def round_trip_ns(trips: int = TRIPS) -> float | None:
    """Nanoseconds for one round trip of a cache line between two CPUs (Python loops included), or None on a
    machine with one CPU."""
    def parent(words: np.ndarray, _: memoryview) -> float:
        deadline = time.monotonic() + DEADLINE_S
        start = time.perf_counter()
        for step in range(trips):
            words[0] = 2 * step + 1
            _wait(words, 2 * step + 2, deadline)
        return (time.perf_counter() - start) / trips * 1e9

    return _in_pinned_pair(parent, lambda words, _: _serve(words, trips))


def copy_after_peer_read_us(calls: int = 60, peer_reads: bool = True, nbytes: int = COPY_BYTES) -> float | None:
    """Median microseconds to copy ``nbytes`` into a shared buffer that, between copies, the other CPU copies
    out (``peer_reads``) or leaves alone; None on a machine with one CPU."""
    def parent(words: np.ndarray, data: memoryview) -> float:
        target = np.frombuffer(data, np.uint8, nbytes)
        source = np.ones(nbytes, np.uint8)
        deadline = time.monotonic() + DEADLINE_S
        times = []
        for step in range(calls):
            start = time.perf_counter()
            target[:] = source
            times.append(time.perf_counter() - start)
            words[0] = 2 * step + 1
            _wait(words, 2 * step + 2, deadline)
        return statistics.median(times[calls // 6:]) * 1e6

    def child(words: np.ndarray, data: memoryview) -> None:
        shared, out = np.frombuffer(data, np.uint8, nbytes), np.empty(nbytes, np.uint8)

        def read(_: int) -> None:
            out[:] = shared
        _serve(words, calls, read if peer_reads else None)

    return _in_pinned_pair(parent, child, nbytes)


def _rows(repeat: int) -> Iterator[str]:
    for _ in range(repeat):
        trip = round_trip_ns()
        if trip is None:
            yield "one CPU: nothing to measure"
            return
        read, alone = copy_after_peer_read_us(), copy_after_peer_read_us(peer_reads=False)
        yield (f"round trip {trip:4.0f} ns   copy of 4 MiB into memory the other CPU just read {read:5.0f} us, "
               f"into memory it left alone {alone:5.0f} us")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="measurements, one line each (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    for row in _rows(args.repeat):
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
