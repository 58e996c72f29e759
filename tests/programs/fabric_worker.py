"""One instance of a fabric test job: connect, run a scenario, report.

usage: fabric_worker.py SCENARIO OUT_DIR

The job comes from the environment (never argv: the token is a secret):
FABRIC_ADDRESS=host:port, FABRIC_TOKEN=hex, FABRIC_JOB, FABRIC_INSTANCE,
FABRIC_INSTANCES, FABRIC_TRANSPORT, FABRIC_HOST (the host label, if any), FABRIC_BIND (the address
its TCP listener binds; default 127.0.0.1).
Results go to OUT_DIR/<instance>.npz; errors are printed as one JSON line
{"error": type, "instance": ..., "message": ...}.

Scenarios:
  suite     print how each link travels ({"links": {peer: "tcp" | "unix" | "unix+mailbox"}}), then
            run every case of fabric_cases.suite(n), in order
  send-across-barrier  instance 0 sends 32 MiB and a small message, then a barrier and an allreduce;
            instance 1 receives both after them: {"received": True}
  any-from-lost  instance 1 waits for a message from 0 or 2 (message_waiting), and 0 is killed
  mismatch  allreduce with a dtype (instance 1) or shape (instance 2) unlike the others'
  mismatch-last  allreduce where only the last instance's dtype differs
  loop      allreduce 4 MiB arrays until an error; prints "ready" after the first
  loop-gather, loop-broadcast  the same with allgathers or broadcasts (root 0) of 1 KiB arrays (the
            boards' path, algorithms/board_copies.py)
  mismatch-board  small calls of the whole job, on the boards: allgathers of float32[16] (instance 0) and
            float32[17] (instance 1), an allreduce of float32[16] (instance 2), broadcasts of float32[16]
            from root 0 (instance 3) and root 1 (instance 4)
  churn     60 allreduces whose sizes, dtypes and layouts change from one to the next, each checked
            (exact integer-valued sums): shared segments reused as early as the algorithms allow, and
            board frames between them
  shm-phases  allreduces through shared memory (1.2 MB thrice: the chunked layout; 200 KB: the whole one;
            1.2 MB), each checked exactly; after each, {"phases": [the phases this instance ran through
            the engine's run or run_all]}
  copy-churn  48 broadcasts (every root) and allgathers whose sizes and roots change, with allreduces
            between them, each checked exactly; then {"done": i, "copies": calls that took shared memory}
  mismatch-copies  three instances' shared-memory calls that differ: broadcast from root 0, from root 1,
            and an allgather
  copies-out  broadcasts (every root, in place and into another array) and allgathers into an ``out``, small
            and through shared memory, each compared bit for bit with the fresh-array form; then a wrong
            ``out`` on instance 1 alone, then on every instance ({"bad_out": message or None} each), and a
            last allgather (the fabric still works); then {"board_plans": [root rank or -1, shape] of each
            signature that took the boards, "steady": the same of each that went through shared memory, whose
            next calls go there straight (``steady_calls.SteadyCall``)}
  allreduce-out  allreduces into an ``out`` (another array, twice with new values: the second call takes the
            hot path; in place), sum, mean and max, small and through shared memory (160 KB: one phase;
            400 KB: chunked), each compared bit for bit with the fresh-array form; then a wrong ``out`` on
            instance 1 alone ({"bad_out": message or None}), and {"checked": [op, shape] of each plan that
            remembered an ``out`` (a board plan, or a one-phase shared-memory allreduce's
            ``steady_calls.SteadyCall``)}
  copies-again  broadcasts (every root, in place and into another array) and allgathers into one ``out``,
            each twice with new values (the hot path the second time), compared with the fresh-array form
  after-break  a small allreduce twice (its plan made), then instance 0 calls another shape (a mismatch on
            every instance); then the first allreduce again: {"first": error type, "again": error type}
  cross-copies  broadcasts (every root, in place and fresh) and allgathers (fresh and into ``out``) read in
            place from the peers' memory (algorithms/cross_memory.py, its threshold lowered to 256 KiB), a
            shared-segment one between; results to OUT_DIR; then {"cross": usable, "calls": calls read in place}
  cross-refused  the same with instance 1 running as user nobody (setresuid after connecting), so that it
            may not read the others' memory: every instance falls back to the shared segments
  cross-revoked  one large allgather read in place, then instance 1 becomes user nobody (its reads are
            refused from now on) and another: {"cross": usable, "calls": 1} after the first
  copy-late  two allgathers of 400 KB (the second one on the boards' steady path: algorithms/
            shared_copies_board.py), print "ready", then a third, instance 0 at once, the others after reading a
            line from stdin (instance 0's plan gives up waiting and falls back); then broadcasts; each result
            checked; then {"done": i, "fallbacks": calls that fell back}
  spread-shared  (every instance on one CPU, so the host is oversubscribed) 40 broadcasts of 256 KiB from root
            1, each checked (the boards' steady path from the second on): {"done": i, "cpu": the CPU this
            instance last told the others it was on, plus one: 0 if its spreader never ran, pinned CPU + 1}
  mismatch-steady  two allgathers of float32[100000] (the second on the boards' steady path), then a third
            of float32[100001] on instance 0 alone ({"steady_plans": count} before it)
  mismatch-cross  one large allgather ({"cross": usable, "calls": 1}), then broadcasts from root 0
            (instance 0) and 1 (instance 1) and an allgather (instance 2), read in place
  loop-cross  large allgathers and broadcasts from root 1, read in place, until an error; prints "ready" (with
            the cross-memory state) after the first
  bcast-ahead  instance 0 broadcasts float32[256] six times (its value changes each time) and prints
            {"ahead": 6} before the others have called it (they read a line from stdin first: the root waits
            for none of them); then each of them takes the six, checks each value and prints {"checked": 6};
            then a barrier
  bcast-mismatch  a small broadcast from root 0 (instances 0 and 2), an allreduce of the same array
            (instance 1); then a barrier
  skipped-bcast  a small broadcast from root 0 that instance 2 skips, then a small allreduce of the same
            signature everywhere ({"returned": i} if it returns), then a barrier: instance 2's board frame
            is next on its links to the others, and only its sequence number tells it is not this call's
  slow      instance 0 enters a small allreduce (the board's own path) and a barrier at once, the others
            after reading a line from stdin (instance 0 is asleep in poll by then: only a wake-up byte
            can wake it)
  group     instances 0 and n-1 run collectives together; the others close at once
  barrier   connect, print "ready", one barrier
  bystander print "ready", read a line from stdin; then instances 0 and 2 run allreduces as a
            group and a barrier with everyone (the test kills instance 1 first)
  late      print "ready"; instance 0 enters a barrier at once, the others only after reading
            a line from stdin (so the test decides how late they are)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fabric_cases import make_input, suite  # noqa: E402

from simipu.fabric import FabricError, PeerLostError  # noqa: E402
from simipu.fabric.algorithms.placement import CPU  # noqa: E402
from simipu.fabric.algorithms.steady_calls import SteadyCall  # noqa: E402
from simipu.fabric.connect import connect  # noqa: E402


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def run_suite(fabric, instance: int, n: int, out: Path) -> None:
    results = {}
    for case in suite(n):
        if instance in case.members(n):
            results[case.name] = case.run(fabric, instance, n)
    np.savez(out / f"{instance}.npz", **results)


def run_mismatch(fabric, instance: int, n: int, odd: tuple[int, int]) -> None:
    dtype = "float64" if instance == odd[0] else "float32"
    shape = (5, 3) if instance == odd[1] else (4, 3)
    fabric.allreduce(np.ones(shape, dtype=dtype))


def run_mismatch_paths(fabric, instance: int) -> None:
    """Three different ways to the wire at once: the board (a small allreduce, to everyone), shared memory
    announced on the links (a large allreduce), and link frames to one root (a broadcast)."""
    if instance == 0:
        fabric.allreduce(np.ones(16, np.float32))
    elif instance == 1:
        fabric.allreduce(np.ones(100_000, np.float32))
    else:
        fabric.broadcast(np.ones(16, np.float32), root=0)


def run_churn(fabric, instance: int, n: int) -> None:
    shapes = [(300_001, "float32"), (300_001, "float32"), (20_000, "int32"), (20_000, "int32"), (1_000, "float32"),
              (70_000, "float64"), (20_000, "int32"), (7, "int64"), (40_000, "int64"), (300_001, "float32")]
    for step in range(60):
        count, dtype = shapes[step % len(shapes)]
        values = (np.arange(count) % 97 + instance + step).astype(dtype)
        got = fabric.allreduce(values)
        want = (n * (np.arange(count) % 97 + step) + n * (n - 1) // 2).astype(dtype)
        if not np.array_equal(got, want):
            raise SystemExit(f"step {step}: {int((got != want).sum())} of {count} elements wrong")


def run_shm_phases(fabric, instance: int, n: int) -> None:
    phases: list[int] = []
    run, run_all = fabric.run, fabric.run_all

    def recorded(method):
        def recording(call, phase, *args, **kwargs):
            phases.append(int(phase))
            return method(call, phase, *args, **kwargs)
        return recording
    fabric.run, fabric.run_all = recorded(run), recorded(run_all)
    for step, count in enumerate([300_001, 300_001, 300_001, 50_000, 300_001]):
        values = (np.arange(count) % 97 + instance + step).astype(np.float32)
        want = (n * (np.arange(count) % 97 + step) + n * (n - 1) // 2).astype(np.float32)
        if not np.array_equal(fabric.allreduce(values), want):
            raise SystemExit(f"step {step}: wrong result")
        report(phases=phases[:])
        phases.clear()


def run_copy_churn(fabric, instance: int, n: int) -> int:
    """Broadcasts and allgathers back to back (the shared arena's halves reused as early as allowed, layouts
    changing), allreduces between them; returns how many calls went through shared memory."""
    shapes = [(100_000, "float32"), (100_000, "float32"), (30_000, "int64"), (7, "int32"), (100_000, "float32"),
              (250_000, "uint8"), (30_000, "int64"), (30_000, "int64")]
    for step in range(48):
        count, dtype = shapes[step % len(shapes)]
        values = (np.arange(count) % 89 + 3 * instance + step).astype(dtype)
        if step % 3 == 2:
            got = fabric.allgather(values)
            want = np.stack([(np.arange(count) % 89 + 3 * i + step).astype(dtype) for i in range(n)])
        else:
            root = (step // 3) % n
            got = fabric.broadcast(values, root=root)
            want = (np.arange(count) % 89 + 3 * root + step).astype(dtype)
        if got.shape != want.shape or not np.array_equal(got, want):
            raise SystemExit(f"step {step}: {got.shape} against {want.shape}, or values wrong")
        if step % 4 == 3:
            fabric.allreduce(values.astype(np.float64))
    return sum(arena.uses for key, arena in fabric._arenas.items() if key[0] == "copy")


def run_copy_ring(fabric, instance: int, n: int) -> dict:
    """256 KiB broadcasts from one root, allgathers and allreduces, each kind in a loop long enough to go round
    its ring of slots (``shared.slots_for``: 16 of them) twice, every call's values its own: each result exact. Returns the
    bytes of this instance's own segments, by use ("copy", "reduce")."""
    count = 65_536  # float32: 256 KiB per array
    calls = 2 * 16 + 3  # (16 slots of 256 KiB: RING_BYTES)
    for step in range(calls):
        values = (np.arange(count) % 83 + 5 * instance + step).astype(np.float32)
        if not np.array_equal(fabric.broadcast(values, root=1), (np.arange(count) % 83 + 5 + step).astype(np.float32)):
            raise SystemExit(f"broadcast {step}: wrong values")
    for step in range(calls):
        part = (np.arange(count // n) % 83 + 5 * instance + step).astype(np.float32)
        want = np.stack([(np.arange(count // n) % 83 + 5 * i + step).astype(np.float32) for i in range(n)])
        if not np.array_equal(fabric.allgather(part), want):
            raise SystemExit(f"allgather {step}: wrong values")
    for step in range(calls):
        values = (np.arange(count) % 83 + 5 * instance + step).astype(np.float32)
        want = (n * (np.arange(count) % 83 + step) + 5 * n * (n - 1) // 2).astype(np.float32)
        if not np.array_equal(fabric.allreduce(values), want):
            raise SystemExit(f"allreduce {step}: wrong values")
    return {key[0]: arena._mine.size for key, arena in fabric._arenas.items() if arena._mine is not None}


def run_mismatch_copies(fabric, instance: int) -> None:
    big = np.ones(100_000, np.float32)
    if instance < 2:
        fabric.broadcast(big, root=instance)
    else:
        fabric.allgather(big)


def run_copies_out(fabric, instance: int, n: int) -> None:
    for count in (7, 1_000, 100_000):  # board-sized and link frames, then shared memory (400 KB)
        for root in range(n):
            x = (np.arange(count) * 0.37 + instance).astype(np.float32)
            fresh = fabric.broadcast(x, root=root)
            if fresh.tobytes() != (np.arange(count) * 0.37 + root).astype(np.float32).tobytes():
                raise SystemExit(f"broadcast of {count} from {root}: wrong values")
            into = np.full_like(x, -1.0)
            same = fabric.broadcast(x, root=root, out=into) is into and into.tobytes() == fresh.tobytes()
            inplace = fabric.broadcast(x, root=root, out=x) is x and x.tobytes() == fresh.tobytes()
            if not (same and inplace):
                raise SystemExit(f"broadcast of {count} from {root}: out= differs from the fresh array")
        x = (np.arange(count) * 0.37 + instance).astype(np.float32)
        out = np.full((n, count), -1.0, np.float32)
        fresh = fabric.allgather(x)
        if fresh.tobytes() != np.stack([(np.arange(count) * 0.37 + i).astype(np.float32) for i in range(n)]).tobytes():
            raise SystemExit(f"allgather of {count}: wrong values")
        row = out[instance]
        row[:] = x
        if fabric.allgather(x, out=out) is not out or out.tobytes() != fresh.tobytes() \
                or fabric.allgather(row, out=out).tobytes() != fresh.tobytes():  # (x a row of out: in place)
            raise SystemExit(f"allgather of {count}: out= differs from the fresh array")
    for bad_on in ((1,), tuple(range(n))):
        for count in (1_000, 100_000):
            out = np.empty((n, count + 1 if instance in bad_on else count), np.float32)
            try:
                fabric.allgather(np.ones(count, np.float32), out=out)
                message = None
            except ValueError as exc:
                message = str(exc)
            report(bad_out=message)
    fabric.allgather(np.ones(3, np.float32))
    plans = fabric._copies.plans
    report(board_plans=sorted([root, list(shape)] for (root, _, shape), plan in plans.items()
                              if not isinstance(plan, SteadyCall)),
           steady=sorted([root, list(shape)] for (root, _, shape), plan in plans.items() if isinstance(plan, SteadyCall)))


def run_allreduce_out(fabric, instance: int, n: int) -> None:
    for count in (7, 1_000, 40_000, 100_000):  # board-sized, then shared memory (one phase, then chunked)
        for op in ("sum", "mean", "max"):
            x = (np.arange(count) * 0.37 + instance).astype(np.float32)
            into = np.full_like(x, -1.0)
            for step in range(2):  # (the second call: the engine's hot path, unchecked)
                x += step
                fresh = fabric.allreduce(x, op)
                if fabric.allreduce(x, op, out=into) is not into or into.tobytes() != fresh.tobytes():
                    raise SystemExit(f"allreduce({op}) of {count}, call {step}: out= differs from the fresh array")
            inplace = x.copy()
            if fabric.allreduce(inplace, op, out=inplace) is not inplace or inplace.tobytes() != fresh.tobytes():
                raise SystemExit(f"allreduce({op}) of {count} in place differs from the fresh array")
    out = np.empty(1_001 if instance == 1 else 1_000, np.float32)
    try:
        fabric.allreduce(np.ones(1_000, np.float32), out=out)
        message = None
    except ValueError as exc:
        message = str(exc)
    report(bad_out=message)
    if fabric.allreduce(np.ones(3, np.float32)).tolist() != [n] * 3:
        raise SystemExit("the fabric is not usable after a wrong out")
    report(checked=sorted([op, list(shape)] for (_, shape, op), plan in fabric._boards.plans.items()
                          if plan.checked_out is not None))


def run_copies_again(fabric, instance: int, n: int) -> None:
    for count in (7, 1_000):
        x = (np.arange(count) * 0.37 + instance).astype(np.float32)
        into = np.full_like(x, -1.0)
        rows = np.full((n, count), -1.0, np.float32)
        for step in range(2):  # (the second call of each: the engine's hot path, unchecked)
            x += 1
            for root in range(n):
                fresh = fabric.broadcast(x, root=root)
                if fabric.broadcast(x, root=root, out=into) is not into or into.tobytes() != fresh.tobytes():
                    raise SystemExit(f"broadcast of {count} from {root}, call {step}: out= differs")
                mine = x.copy()
                if fabric.broadcast(mine, root=root, out=mine) is not mine or mine.tobytes() != fresh.tobytes():
                    raise SystemExit(f"broadcast of {count} from {root} in place, call {step}: differs")
            fresh = fabric.allgather(x)
            if fabric.allgather(x, out=rows) is not rows or rows.tobytes() != fresh.tobytes():
                raise SystemExit(f"allgather of {count}, call {step}: out= differs from the fresh array")


def run_after_break(fabric, instance: int) -> None:
    small = np.ones(16, np.float32)
    fabric.allreduce(small)
    fabric.allreduce(small)
    errors = []
    for array in (np.ones(17 if instance == 0 else 16, np.float32), small):
        try:
            fabric.allreduce(array)
            errors.append(None)
        except FabricError as exc:
            errors.append(type(exc).__name__)
    report(first=errors[0], again=errors[1])


def lower_cross_threshold() -> None:
    """Read arrays in place from 256 KiB (every instance the same): the tests' arrays stay small."""
    from simipu.fabric.algorithms import cross_memory

    cross_memory.CROSS_MEMORY_BYTES = 256 * 1024


def become_nobody() -> None:
    """Run on as user nobody: no CAP_SYS_PTRACE, another user, so the kernel refuses its reads of the others'
    memory (process_vm_readv)."""
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)


def cross_state(fabric) -> dict:
    crosses = list(fabric._cross.values())  # (none over TCP: the path is for one host)
    return {"cross": crosses[0].usable if crosses else None, "calls": sum(c.calls for c in crosses)}


def run_cross_copies(fabric, instance: int, n: int, refused: bool) -> None:
    """Each result checked bit for bit here; the digest of them all lets the test compare jobs and instances."""
    lower_cross_threshold()
    if refused and instance == 1:
        become_nobody()
    digest = hashlib.sha256()
    for step, count in enumerate((100_000, 70_001, 30_000, 100_000)):  # 400 KB, 280 KB, then 120 KB: segments
        def values(i: int, count: int = count, step: int = step) -> np.ndarray:
            return (np.arange(count) * 0.37 + i + step).astype(np.float32)
        for root in range(n):
            x = values(instance)
            got = [fabric.broadcast(x, root=root), fabric.broadcast(x, root=root, out=x)]
            if any(g.tobytes() != values(root).tobytes() for g in got):
                raise SystemExit(f"broadcast of {count} from {root}: wrong values")
            digest.update(got[0].tobytes())
        x = values(instance)
        rows = np.full((n, count), -1.0, np.float32)
        got = [fabric.allgather(x), fabric.allgather(x, out=rows)]
        if any(g.tobytes() != np.stack([values(i) for i in range(n)]).tobytes() for g in got):
            raise SystemExit(f"allgather of {count}: wrong values")
        digest.update(got[0].tobytes())
    report(**cross_state(fabric), digest=digest.hexdigest())


def run_copy_late(fabric, instance: int, n: int) -> int:
    from simipu.fabric.engine import Fabric

    fallbacks = [0]
    general = Fabric._copy_fallback

    def counted(self, *args):  # (the engine's own fallback, counted)
        fallbacks[0] += 1
        return general(self, *args)

    Fabric._copy_fallback = counted  # type: ignore[method-assign]
    x = (np.arange(100_000) % 89 + 3 * instance).astype(np.float32)
    want = np.stack([(np.arange(100_000) % 89 + 3 * i).astype(np.float32) for i in range(n)])
    rows = np.empty_like(want)
    for step in range(3):
        if step == 2:
            report(ready=instance, pid=os.getpid())
            if instance != 0:
                sys.stdin.readline()
        if fabric.allgather(x, out=rows).tobytes() != want.tobytes():
            raise SystemExit(f"allgather {step}: wrong values")
    for _ in range(3):
        y = x.copy()
        if fabric.broadcast(y, root=n - 1, out=y).tobytes() != want[n - 1].tobytes():
            raise SystemExit("broadcast: wrong values")
    return fallbacks[0]


def run_mismatch_steady(fabric, instance: int) -> None:
    for step in range(3):
        if step == 2:
            report(steady_plans=len(fabric._copy_plans))
        fabric.allgather(np.ones(100_001 if step == 2 and instance == 0 else 100_000, np.float32))


def run_spread_shared(fabric) -> int:
    count = 65_536  # float32: 256 KiB, 16 slots of the ring
    for step in range(40):
        values = np.full(count, 10 * fabric.instance + step, np.float32)
        if not np.array_equal(fabric.broadcast(values, root=1), np.full(count, 10 + step, np.float32)):
            raise SystemExit(f"broadcast {step}: wrong values")
    return int(fabric._boards.spreader._mine[CPU])


def run_cross_revoked(fabric, instance: int) -> None:
    lower_cross_threshold()
    big = np.ones(100_000, np.float32)
    fabric.allgather(big)
    report(**cross_state(fabric))
    if instance == 1:
        become_nobody()
    fabric.allgather(big)


def run_mismatch_cross(fabric, instance: int) -> None:
    lower_cross_threshold()
    big = np.ones(100_000, np.float32)
    fabric.allgather(big)
    report(**cross_state(fabric))
    if instance < 2:
        fabric.broadcast(big, root=instance)
    else:
        fabric.allgather(big)


def run_loop_cross(fabric, instance: int) -> None:
    lower_cross_threshold()
    x = np.full(100_000, instance, np.float32)
    fabric.allgather(x)
    report(ready=instance, pid=os.getpid(), **cross_state(fabric))
    while True:
        fabric.broadcast(x, root=1)
        fabric.allgather(x)


def run_mismatch_board(fabric, instance: int) -> None:
    """Small calls of the whole job, each on its board: allgathers of two shapes, an allreduce, broadcasts
    from two roots."""
    if instance < 2:
        fabric.allgather(np.ones(16 + instance, np.float32))
    elif instance == 2:
        fabric.allreduce(np.ones(16, np.float32))
    else:
        fabric.broadcast(np.ones(16, np.float32), root=instance - 3)


def run_bcast_ahead(fabric, instance: int) -> None:
    """The small broadcast among three members or more does not wait for its readers (board_copies.RootBroadcast):
    its first two frames go to the mailboxes, the rest to the sockets once the slots stay full."""
    count = 6
    if instance == 0:
        for step in range(count):
            fabric.broadcast(np.full(256, step, np.float32), root=0)
        report(ahead=count)
    else:
        report(ready=instance, pid=os.getpid())
        sys.stdin.readline()
        for step in range(count):
            got = fabric.broadcast(np.full(256, -1, np.float32), root=0)
            if got.tobytes() != np.full(256, step, np.float32).tobytes():
                raise SystemExit(f"broadcast {step}: wrong values {got[:4]}")
        report(checked=count)
    fabric.barrier()


def run_bcast_mismatch(fabric, instance: int) -> None:
    """A reader calls something else: it sees the root's header; the others, which the root does not wait
    for, hear of it by its notice (in this call or the next)."""
    x = np.ones(16, np.float32)
    if instance == 1:
        fabric.allreduce(x)
    else:
        fabric.broadcast(x, root=0)
        fabric.barrier()


def run_skipped_bcast(fabric, instance: int) -> None:
    x = np.ones(16, np.float32)
    if instance != 2:
        fabric.broadcast(x, root=0)
    fabric.allreduce(x)
    report(returned=instance)
    fabric.barrier()


def run_slow(fabric, instance: int, n: int, out: Path) -> None:
    report(ready=instance, pid=os.getpid())
    if instance != 0:
        sys.stdin.readline()
    total = fabric.allreduce(np.full(5, instance + 1, np.int64))
    fabric.barrier()
    np.savez(out / f"{instance}.npz", total=total)


def run_loop(fabric, instance: int, n: int, collective: str = "allreduce") -> None:
    array = make_input("loop", instance, "float32", (1 << 20,) if collective == "allreduce" else (256,))
    call = getattr(fabric, collective)
    call(array)
    report(ready=instance, pid=os.getpid())
    while True:
        call(array)


def run_group(fabric, instance: int, n: int, out: Path) -> None:
    pair = (0, n - 1)
    if instance not in pair:
        return
    results = {"small": fabric.allreduce(make_input("group", instance, "float64", (10,)), group=pair),
               "large": fabric.allreduce(make_input("group", instance, "float32", (500_000,)), group=pair),
               "gather": fabric.allgather(np.array([instance]), group=pair)}
    fabric.barrier(group=pair)
    np.savez(out / f"{instance}.npz", **results)


def run_messages(fabric, instance: int, n: int, out: Path) -> None:
    """Every instance sends to every other first (a small and a 1 MiB message each), then receives them all:
    with eager sends nobody waits for a receiver."""
    for peer in range(n):
        if peer != instance:
            fabric.send(np.array([instance, peer], np.int64), peer)
            fabric.send(make_input(f"message{instance}to{peer}", instance, "float32", (1 << 18,)), peer)
    results = {}
    for peer in range(n):
        if peer != instance:
            results[f"small{peer}"] = fabric.recv(np.empty(2, np.int64), peer)
            results[f"large{peer}"] = fabric.recv(np.empty(1 << 18, np.float32), peer)
    fabric.barrier()
    np.savez(out / f"{instance}.npz", **results)


def run_message_flood(fabric, instance: int, n: int) -> None:
    """Two instances each send the other far more than the link holds (4,000 small messages, then 16 of
    1 MiB) before either receives: each takes the other's while its own wait for room. Reports whether every
    message arrived whole and in order."""
    peer = 1 - instance
    for k in range(4000):
        fabric.send(np.full(4, k + 10_000 * instance, np.int32), peer)
    for k in range(16):
        fabric.send(np.full(1 << 18, k + 100 * instance, np.float32), peer)
    small = all((fabric.recv(np.empty(4, np.int32), peer) == k + 10_000 * peer).all() for k in range(4000))
    large = all((fabric.recv(np.empty(1 << 18, np.float32), peer) == k + 100 * peer).all() for k in range(16))
    fabric.barrier()
    report(flood=instance, small=bool(small), large=bool(large))


def run_blocked_send_mismatch(fabric, instance: int) -> None:
    """Instance 0 sends 32 MiB, more than the link holds, while instance 1 waits for a message of another shape:
    instance 1 finds the mismatch, and instance 0, waiting for room, hears of it at once."""
    if instance == 0:
        fabric.send(np.ones(1 << 22), 1)
    else:
        fabric.recv(np.empty(4), 0)
    fabric.barrier()


def run_send_across_barrier(fabric, instance: int) -> None:
    """Instance 0 sends 32 MiB, more than the link holds, then a small message, while instance 1 enters a barrier
    and an allreduce: its collectives set both messages aside (as MPI buffers them), and instance 1 receives them
    after: {"received": whole and in order}."""
    big = np.arange(1 << 22, dtype=np.float64)
    if instance == 0:
        fabric.send(big, 1)
        fabric.send(np.array([7], np.int64), 1)
    fabric.barrier()
    total = fabric.allreduce(np.full(4, instance + 1, np.int64))
    if instance == 1:
        whole = np.array_equal(fabric.recv(np.empty_like(big), 0), big)
        report(received=bool(whole and fabric.recv(np.empty(1, np.int64), 0)[0] == 7 and total[0] == 3))


def run_message_mismatch(fabric, instance: int) -> None:
    """Instance 0 sends float32[4]; instance 1 expects int64[4]: a mismatch, raised on both."""
    if instance == 0:
        fabric.send(np.zeros(4, np.float32), 1)
    elif instance == 1:
        fabric.recv(np.empty(4, np.int64), 0)
    fabric.barrier()


def run_recv_from_lost(fabric, instance: int) -> None:
    """Instance 1 waits for a message that instance 0 never sends (it is killed)."""
    report(ready=instance, pid=os.getpid())
    if instance == 0:
        sys.stdin.readline()
    else:
        fabric.recv(np.empty(2, np.int64), 0)


def run_any_from_lost(fabric, instance: int) -> None:
    """Instance 1 waits for a message from instance 0 or 2, which never send: 0 is killed, 2 waits on stdin. First
    it looks without waiting: {"looked": None}."""
    report(ready=instance, pid=os.getpid())
    if instance != 1:
        sys.stdin.readline()
    else:
        report(looked=fabric.message_waiting([0, 2]))
        fabric.message_waiting([0, 2], block=True)


def main() -> int:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    host, port = os.environ["FABRIC_ADDRESS"].rsplit(":", 1)
    instance, n = int(os.environ["FABRIC_INSTANCE"]), int(os.environ["FABRIC_INSTANCES"])
    if scenario == "spread-shared":  # (before connecting: the fabric's spreader reads the mask once)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    try:
        fabric = connect((host, int(port)), bytes.fromhex(os.environ["FABRIC_TOKEN"]), job_id=os.environ["FABRIC_JOB"],
                         instance=instance, num_instances=n, transport=os.environ.get("FABRIC_TRANSPORT", "auto"),
                         timeout=float(os.environ.get("FABRIC_TIMEOUT", "10")), startup_timeout=30,
                         host_label=os.environ.get("FABRIC_HOST") or None,
                         bind_host=os.environ.get("FABRIC_BIND") or "127.0.0.1")
    except FabricError as exc:
        report(error=type(exc).__name__, instance=getattr(exc, "instance", None), message=str(exc))
        return 3
    started = time.monotonic()
    try:
        if scenario == "suite":
            report(links={str(peer): kind for peer, kind in fabric.transports().items()})
            run_suite(fabric, instance, n, out)
        elif scenario == "mismatch":
            run_mismatch(fabric, instance, n, (1, 2))
        elif scenario == "mismatch-paths":
            run_mismatch_paths(fabric, instance)
        elif scenario == "mismatch-last":
            run_mismatch(fabric, instance, n, (n - 1, -1))
        elif scenario == "churn":
            run_churn(fabric, instance, n)
        elif scenario == "shm-phases":
            run_shm_phases(fabric, instance, n)
        elif scenario == "copy-churn":
            report(done=instance, copies=run_copy_churn(fabric, instance, n))
            return 0
        elif scenario == "copy-ring":
            report(done=instance, segments=run_copy_ring(fabric, instance, n))
            return 0
        elif scenario == "mismatch-copies":
            run_mismatch_copies(fabric, instance)
        elif scenario == "copies-out":
            run_copies_out(fabric, instance, n)
        elif scenario == "allreduce-out":
            run_allreduce_out(fabric, instance, n)
        elif scenario == "copies-again":
            run_copies_again(fabric, instance, n)
        elif scenario == "after-break":
            run_after_break(fabric, instance)


        elif scenario in ("cross-copies", "cross-refused"):
            run_cross_copies(fabric, instance, n, scenario == "cross-refused")
            return 0
        elif scenario == "copy-late":
            report(done=instance, fallbacks=run_copy_late(fabric, instance, n))
            return 0
        elif scenario == "spread-shared":
            report(done=instance, cpu=run_spread_shared(fabric))
            return 0
        elif scenario == "mismatch-steady":
            run_mismatch_steady(fabric, instance)
        elif scenario == "cross-revoked":
            run_cross_revoked(fabric, instance)
        elif scenario == "mismatch-cross":
            run_mismatch_cross(fabric, instance)
        elif scenario == "loop-cross":
            run_loop_cross(fabric, instance)
        elif scenario == "bcast-ahead":
            run_bcast_ahead(fabric, instance)
        elif scenario == "bcast-mismatch":
            run_bcast_mismatch(fabric, instance)
        elif scenario == "skipped-bcast":
            run_skipped_bcast(fabric, instance)
        elif scenario == "slow":
            run_slow(fabric, instance, n, out)
        elif scenario == "loop":
            run_loop(fabric, instance, n)
        elif scenario in ("loop-gather", "loop-broadcast"):
            run_loop(fabric, instance, n, "allgather" if scenario == "loop-gather" else "broadcast")
        elif scenario == "mismatch-board":
            run_mismatch_board(fabric, instance)
        elif scenario == "group":
            run_group(fabric, instance, n, out)
        elif scenario == "messages":
            run_messages(fabric, instance, n, out)
        elif scenario == "message-flood":
            run_message_flood(fabric, instance, n)
        elif scenario == "blocked-send-mismatch":
            run_blocked_send_mismatch(fabric, instance)
        elif scenario == "send-across-barrier":
            run_send_across_barrier(fabric, instance)
        elif scenario == "message-mismatch":
            run_message_mismatch(fabric, instance)
        elif scenario == "recv-from-lost":
            run_recv_from_lost(fabric, instance)
        elif scenario == "any-from-lost":
            run_any_from_lost(fabric, instance)
        elif scenario == "barrier":
            report(ready=instance, pid=os.getpid())
            fabric.barrier()
        elif scenario == "bystander":
            report(ready=instance, pid=os.getpid())
            sys.stdin.readline()
            results = {f"r{k}": fabric.allreduce(np.full(4, k + instance, np.int64), group=(0, 2)) for k in range(3)}
            np.savez(out / f"{instance}.npz", **results)
            fabric.barrier()
        elif scenario == "late":
            report(ready=instance, pid=os.getpid())
            if instance != 0:
                sys.stdin.readline()
            fabric.barrier()
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
    except FabricError as exc:
        lost = exc.instance if isinstance(exc, PeerLostError) else None
        report(error=type(exc).__name__, instance=lost, message=str(exc), seconds=time.monotonic() - started)
        return 3
    finally:
        fabric.close()
    report(done=instance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
