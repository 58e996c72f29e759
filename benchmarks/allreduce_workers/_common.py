"""What every collective worker shares: the plan, the input data, the timing loop, the result file.

A worker runs as a script (``python <worker>.py --plan ... --out ... [--collective C]``) under its
launcher, so this module is imported from the script's own directory. It needs
NumPy only; each worker brings its library's collectives, barrier and gather.
``--collective`` picks the one timed: ``allreduce`` (the default), ``broadcast`` (root 0)
or ``allgather``. A size is the bytes of the result, as NCCL's tests count them: for
``allgather`` each process contributes ``size / N`` bytes.

Per size, on every instance:

1. barrier; one call on a known pattern, every element checked
   (rank r holds ``(i % 251) + 1000 r``: an allreduce gives ``N * (i % 251) + 1000 * N(N-1)/2``,
   a broadcast rank 0's pattern, an allgather every rank's in rank order; all exact in float32);
2. ``warmup`` untimed calls, then a barrier;
3. ``iters`` calls, each timed alone with ``perf_counter``;
4. the last timed result is checked too; then every instance's timings and
   checks are gathered (outside the timing) and instance 0 keeps, per
   iteration, the slowest instance's time (and its own, for comparison).

A worker may give a ``paired`` call too (the Horovod worker: the plain
``popdist.collectives.allreduce`` on the same bytes). Then the timed calls
alternate, in blocks of ``PAIR_BLOCK``, between the two, and each gets
``iters`` samples. Both run in the same processes at the same moments, so
their ratio is free of what moves every figure from one launch to the next
on a shared machine.

Instance 0 writes all of it as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

import numpy as np

DTYPE = np.float32
PATTERN_PERIOD = 251  # values stay small integers: every sum is exact in float32
RANK_OFFSET = 1000.0
COLLECTIVES = ("allreduce", "broadcast", "allgather")
#: Calls in a row of one of two paired calls before the other's (see the module docstring), at most: a size
#: timed in fewer than ten blocks of it alternates in blocks of a tenth of its calls (64 MiB's 10: one by one).
PAIR_BLOCK = 20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="bytes:warmup:iters[,bytes:warmup:iters...]")
    parser.add_argument("--out", required=True, help="JSON written by instance 0")
    parser.add_argument("--label", default="", help="recorded in the JSON")
    parser.add_argument("--collective", default="allreduce", choices=COLLECTIVES, help="the collective timed")
    return parser.parse_args()


def parse_plan(text: str) -> list[tuple[int, int, int]]:
    plan = []
    for item in text.split(","):
        nbytes, warmup, iters = (int(v) for v in item.split(":"))
        plan.append((nbytes, warmup, iters))
    return plan


def pattern(count: int, rank: int) -> np.ndarray:
    x = (np.arange(count, dtype=np.int64) % PATTERN_PERIOD).astype(DTYPE)
    x += DTYPE(RANK_OFFSET * rank)
    return x


def expected(count: int, n: int) -> np.ndarray:
    x = (np.arange(count, dtype=np.int64) % PATTERN_PERIOD).astype(DTYPE) * DTYPE(n)
    x += DTYPE(RANK_OFFSET * n * (n - 1) / 2)
    return x


def inputs_and_expected(collective: str, nbytes: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's input for one call of ``collective`` whose result is ``nbytes``, and the result (flat)."""
    count = nbytes // np.dtype(DTYPE).itemsize
    if collective == "allreduce":
        return pattern(count, rank), expected(count, n)
    if collective == "broadcast":
        return pattern(count, rank), pattern(count, 0)
    part = count // n
    return pattern(part, rank), np.concatenate([pattern(part, r) for r in range(n)])


_preallocated: dict[tuple, np.ndarray] = {}


def preallocated(x: np.ndarray, rows: int = 0) -> np.ndarray:
    """The one result array a worker fills for ``x`` (MPI's receive buffer): ``x``'s shape, or ``rows`` of it
    (an allgather's). Made once per shape, outside the timing; each worker looks it up in the timed call the
    same way, and always gets the same object (a new view each call would be a cost one side pays and, for
    poprun, a new ``out`` to check)."""
    key = (rows, x.shape, x.dtype.str)
    out = _preallocated.get(key)
    if out is None:
        out = _preallocated[key] = np.empty((rows, *x.shape) if rows else x.shape, dtype=x.dtype)
    return out


NO_TIMES = np.empty(0)  # (no paired call)


def size_record(nbytes: int, warmup: int, iters: int, everyone: list[dict], pairing: bool) -> dict:
    """One size's entry in the JSON's ``sizes``, from every rank's gathered times (and paired times) and
    problems."""
    return {
        "bytes": nbytes,
        "warmup": warmup,
        "iters": iters,
        "problems": {str(r): p["problems"] for r, p in enumerate(everyone) if p["problems"]},
        **latencies(everyone, "times"),
        **({"paired_" + k: v for k, v in latencies(everyone, "paired").items()} if pairing else {}),
    }


def latencies(everyone: list[dict], key: str) -> dict[str, list[float]]:
    """From every rank's ``key`` (seconds per iteration): the slowest rank's per iteration, and rank 0's, in us."""
    table = np.array([r[key] for r in everyone])  # (n, iters) seconds
    return {"max_us": (table.max(axis=0) * 1e6).round(3).tolist(), "rank0_us": (table[0] * 1e6).round(3).tolist()}


def first_difference(got: np.ndarray, want: np.ndarray) -> str:
    got = np.asarray(got).reshape(-1)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if np.array_equal(got, want):
        return ""
    bad = np.flatnonzero(got != want)
    i = int(bad[0])
    return f"{bad.size} of {want.size} elements wrong, e.g. [{i}] = {float(got[i])!r}, want {float(want[i])!r}"


def time_calls(call: Callable[[np.ndarray], np.ndarray], x: np.ndarray, warmup: int, iters: int,
               barrier: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    """``warmup`` untimed calls, a barrier, then ``iters`` calls each timed alone: (seconds, last result)."""
    for _ in range(warmup):
        call(x)
    times = np.empty(iters, dtype=np.float64)
    barrier()
    clock = time.perf_counter
    result = x
    for i in range(iters):
        start = clock()
        result = call(x)
        times[i] = clock() - start
    return times, result


def time_pairs(call: Callable, x: object, paired: Callable, y: np.ndarray, warmup: int, iters: int,
               barrier: Callable[[], None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``time_calls`` of ``call(x)`` and ``paired(y)`` in alternating blocks (``PAIR_BLOCK``):
    (``call``'s seconds, ``paired``'s seconds, ``call``'s last result)."""
    for _ in range(warmup):
        call(x)
        paired(y)
    times = np.empty((2, iters), dtype=np.float64)
    barrier()
    clock = time.perf_counter
    result = x
    block = max(1, min(PAIR_BLOCK, iters // 10))
    for first in range(0, iters, block):
        for i in range(first, min(first + block, iters)):
            start = clock()
            result = call(x)
            times[0, i] = clock() - start
        for i in range(first, min(first + block, iters)):
            start = clock()
            held = paired(y)  # (kept until the next one returns, as ``result`` is: the same frees, in the same order)
            times[1, i] = clock() - start
    del held
    return times[0], times[1], result


def run(
    *,
    tool: str,
    rank: int,
    n: int,
    allreduce: Callable[[np.ndarray], np.ndarray],
    broadcast: Callable[[np.ndarray], np.ndarray] | None = None,
    allgather: Callable[[np.ndarray], np.ndarray] | None = None,
    barrier: Callable[[], None],
    gather: Callable[[object], list],
    init_s: float,
    timed_input: Callable[[np.ndarray], np.ndarray] = lambda x: x,
    paired: Callable[[np.ndarray], np.ndarray] | None = None,
    extra: dict | None = None,
) -> None:
    """The measurement loop (see the module docstring); ``gather`` returns every rank's object, in rank order.

    ``allreduce(x)`` returns the reduced array (it may be ``x`` itself, reduced in
    place); ``broadcast(x)`` rank 0's array (it may be ``x``, overwritten);
    ``allgather(x)`` every rank's ``x`` in rank order, in any shape of that many
    elements. ``timed_input(checked)`` gives what the timed allreduces reduce (in-place libraries get zeros,
    so that repeated sums stay finite; the Horovod worker a tensor sharing the array's memory: tensor in,
    tensor out). ``paired(array)``: a second allreduce timed beside the first (module docstring), on the NumPy
    array that ``timed_input`` was given.
    """
    args = parse_args()
    call = {"allreduce": allreduce, "broadcast": broadcast, "allgather": allgather}[args.collective]
    if call is None:
        raise SystemExit(f"{tool} worker: no {args.collective} here")
    report: dict = {"tool": tool, "label": args.label, "n": n, "init_s": init_s, "sizes": [],
                    "collective": args.collective, "pid0": os.getpid(), **(extra or {})}
    for nbytes, warmup, iters in parse_plan(args.plan):
        x, want = inputs_and_expected(args.collective, nbytes, rank, n)
        barrier()
        problems = []
        wrong = first_difference(call(x.copy()), want)
        if wrong:
            problems.append(f"check before timing: {wrong}")
        array = x
        if args.collective == "allreduce":
            x = timed_input(x)
        want_after = np.asarray(call(np.copy(x))).reshape(-1).copy()  # what every timed call must give
        pairing = paired is not None and args.collective == "allreduce"
        if pairing:
            times, paired_times, result = time_pairs(call, x, paired, array, warmup, iters, barrier)
        else:
            (times, result), paired_times = time_calls(call, x, warmup, iters, barrier), NO_TIMES
        wrong = first_difference(result, want_after)
        if wrong:
            problems.append(f"check of the last timed call: {wrong}")
        everyone = gather({"times": times.tolist(), "paired": paired_times.tolist(), "problems": problems})
        if rank == 0:
            report["sizes"].append(size_record(nbytes, warmup, iters, everyone, pairing))
    barrier()
    if rank == 0:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f)
        os.replace(tmp, args.out)
