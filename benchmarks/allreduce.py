"""Allreduce benchmark: poprun-py's collectives fabric against mpi4py and torch.distributed.

What it measures, side by side in one run: a float32 sum allreduce with N = 2
and 4 processes on this one host, arrays of 4 KiB, 256 KiB, 4 MiB and 64 MiB,
through

* ``poprun --offline-mode=1 --num-instances N --num-replicas N python poprun_worker.py``:
  ``popdist.collectives.allreduce(x, "sum", out=out)`` into a preallocated ``out`` (``popdist.init()``
  first; like for like with mpi4py's), with the default transport (``auto``: shared memory and Unix
  sockets within a host) and again with ``--fabric-transport=tcp`` (``poprun-tcp``: TCP between
  instances even on one host); and ``poprun-new``: the plain ``allreduce(x, "sum")``, a new array each
  call;
* the same launch with ``python hvd_worker.py``: ``hvd.allreduce(t, op=hvd.Sum)`` on float32 CPU torch
  tensors (``import horovod.torch as hvd``, poprun-py's, over the same fabric), a new tensor each call:
  what a Horovod program pays over the NumPy call, as the ratio hvd/poprun-new (target: within 10% from
  256 KiB up); the same worker also times the plain call on the tensor's array, in blocks alternating with
  hvd's (``hvd-plain``), so that "hvd/plain, same procs" compares the two in the same processes at the
  same moments, free of the launch-to-launch spread of a shared machine;
* ``poprun-init``: the persistent allreduce, ``popdist.collectives.allreduce_init(x, "sum")`` bound once and
  called each time (MPI 4's ``MPI_Allreduce_init``; mpi4py on Open MPI 4.1 raises NotImplementedError for
  it), timed by the ``poprun`` launch itself in blocks alternating with the call into ``out``;
* ``mpirun --allow-run-as-root -np N python mpi4py_worker.py`` (Open MPI from
  Debian, ``--oversubscribe`` when N exceeds the cores):
  ``comm.Allreduce(x, out, op=MPI.SUM)`` into a preallocated ``out``;
* ``torchrun --standalone --nproc-per-node N gloo_worker.py`` (torch 2.13.0, CPU):
  ``dist.all_reduce(t)`` in place on a CPU float32 tensor, gloo backend.

The workers live in ``benchmarks/allreduce_workers/`` and share one loop
(``_common.py``). Per size, every process: barrier; one allreduce of a known
pattern, every element checked (so a broken fabric cannot post a fast but wrong
number); warm-up calls; a barrier; K calls, each timed alone; the last result
checked again. Then the timings are gathered (outside the timing) and, per
iteration, the slowest process's time is kept: the latency of an iteration is
when the last process has its result. The tables give the median of those, all
rounds pooled. Instance 0's own median is in the JSON too.

Each (tool, N) is launched once per round, in an order that rotates from one
round to the next, so that machine noise hits every tool alike: five rounds,
fifteen for poprun and mpi4py (``LATENCY_ROUNDS``), the pair issue 19's
latency targets compare. Before each launch a cache line's round trip
between the two CPUs is timed; table 5 gives the two tools' figures apart
for the rounds that found the CPUs near and far apart. Derived:
algorithm bandwidth ``algbw = bytes / latency`` and bus bandwidth
``busbw = algbw * 2(N-1)/N`` (the NCCL-tests convention: what each process's
links carry in a ring or reduce-scatter/allgather allreduce), in GB/s (1e9).
Ratios are poprun's value over the anchor's: below 1 is faster for latency,
above 1 is faster for bandwidth. Targets: poprun's bus bandwidth at or above the
better anchor's from 4 MiB up, and under 30 us at 4 KiB.

Every library keeps its default algorithm and settings; OMP_NUM_THREADS=1 for
all (torchrun sets it anyway). N=4 puts four processes on two cores here, so
N=4 latencies include the scheduler's share.

Anchors missing on this machine are installed first (skip with
``--skip-install``): ``apt-get install -y openmpi-bin libopenmpi-dev`` (as root;
the headers and mpicc wrapper are for mpi4py's build), then
``pip install --no-binary mpi4py mpi4py`` with this interpreter, so that
mpi4py is compiled against the very Open MPI that mpirun runs (PyPI's wheel
would pick an MPI library at run time), and torch's CPU build,
``pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu``.
An anchor that cannot be had is skipped with a note; the rest still runs.

Run it with the project's interpreter, so that ``poprun`` and ``torchrun`` are
the ones beside it::

    .venv/bin/python benchmarks/allreduce.py            # full run (5 rounds, 15 for two tools), 7-8 minutes
    .venv/bin/python benchmarks/allreduce.py --quick    # fewer iterations, one round
    .venv/bin/python benchmarks/allreduce.py --skip-install

Plain tables go to stdout; everything (per-iteration samples included) also
goes to ``benchmarks/results/allreduce.json``.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core_distance import PeerGone, round_trip_ns  # noqa: E402  (which state the host's vCPUs are in: see that module)
from launch import (  # noqa: E402  (the launch benchmark's helpers: same anchors, same conventions)
    CORES,
    RESULTS_DIR,
    ROOT,
    Anchor,
    _install_log,
    command_output,
    ensure_mpirun,
    ensure_torchrun,
    find_poprun,
    format_table,
    git_state,
    machine_info,
    mpirun_argv,
    note,
    poprun_argv,
    python_env,
    run_command,
    say,
)

WORKERS = Path(__file__).resolve().parent / "allreduce_workers"
NS = (2, 4)
KIB, MIB = 1024, 1024 * 1024
SIZES = (4 * KIB, 256 * KIB, 4 * MIB, 64 * MIB)
#: bytes -> (warm-up calls, timed calls) per launch
FULL_PLAN = {4 * KIB: (300, 3000), 256 * KIB: (50, 400), 4 * MIB: (10, 60), 64 * MIB: (2, 10)}
QUICK_PLAN = {4 * KIB: (50, 300), 256 * KIB: (10, 50), 4 * MIB: (3, 10), 64 * MIB: (1, 3)}
FULL_ROUNDS, QUICK_ROUNDS = 5, 1
#: In a full run, the two tools issue 19's targets compare (``poprun``, whose launch also times ``poprun-init``, and
#: ``mpi4py``) are launched in this many rounds, the others in ``FULL_ROUNDS``. This host has two states that last
#: seconds (its CPUs near or far apart: ``STATE_FAR_FACTOR``), and one size's calls in a launch last about 0.1 s, so
#: each round draws one state for each tool. With five draws each, the two medians could come from different
#: states: ratios of 0.86x to 1.77x at the same code, from one run to the next. Fifteen draws make it rare, for
#: about 100 s more.
LATENCY_TOOLS, LATENCY_ROUNDS = ("poprun", "mpi4py"), 15
#: A round drew the far state when the core round trip right before its launch was this many times the run's
#: fastest (here: 406-498 ns near, 625-875 ns far).
STATE_FAR_FACTOR = 1.35
RUN_TIMEOUT = 300.0
TOOLS = ("poprun", "poprun-new", "poprun-tcp", "hvd", "mpi4py", "gloo")
POPRUN_TOOLS = ("poprun", "poprun-new", "poprun-tcp", "hvd")  # launched by poprun
#: The call a worker times beside its own, in the same processes (``_common.run``'s ``paired``), by the worker's
#: tool: the hvd worker's plain ``popdist.collectives.allreduce``, hvd's like for like free of launch-to-launch noise;
#: the poprun worker's persistent allreduce (``allreduce_init``), beside its call into ``out``.
PAIRED = {"hvd": "hvd-plain", "poprun": "poprun-init"}
ANCHORS = ("mpi4py", "gloo")
TARGET_BUSBW_FROM = 4 * MIB
TARGET_SMALL_BYTES, TARGET_SMALL_US = 4 * KIB, 30.0
#: busbw / algbw per collective, as NCCL's tests count it: allreduce 2(N-1)/N, broadcast 1, allgather (N-1)/N
BUS_FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0, "allgather": lambda n: (n - 1) / n}
TARGET_HVD_FROM, TARGET_HVD_RATIO = 256 * KIB, 1.10  # hvd.allreduce latency over popdist.collectives'
#: Issue 19's latency targets over mpi4py's: at most 1.0x below 4 MiB, at most 0.85x from 4 MiB up.
TARGET_MPI_SMALL, TARGET_MPI_LARGE_FROM, TARGET_MPI_LARGE = 1.0, 4 * MIB, 0.85



# -- anchors ---------------------------------------------------------------------------------


def _run_logged(argv: list[str], log: list[str], timeout: float, env: dict[str, str] | None = None) -> str | None:
    """Run an install step, appending to ``log``; None if it worked, else what went wrong."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.append(f"$ {' '.join(argv)}\n<{exc}>")
        return f"'{' '.join(argv)}' failed: {exc}"
    log.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    return None if done.returncode == 0 else f"'{' '.join(argv)}' exited {done.returncode}"


def _mpi4py_version() -> str | None:
    """mpi4py's version and the MPI library it runs on, without initialising MPI."""
    code = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "print(mpi4py.__version__, '|', MPI.Get_library_version().strip().splitlines()[0])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _apt_installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return done.returncode == 0 and "install ok installed" in done.stdout


def ensure_mpi4py(mpirun: Anchor, skip_install: bool) -> Anchor:
    """mpi4py in this interpreter's environment, built against Debian's Open MPI (libopenmpi-dev)."""
    anchor = Anchor("mpi4py")
    if mpirun.path is None:
        anchor.note = f"no mpirun ({mpirun.note}); mpi4py skipped"
        return anchor
    version = _mpi4py_version()
    if version is None and not skip_install:
        log: list[str] = []
        if not _apt_installed("libopenmpi-dev"):
            if os.geteuid() != 0:
                anchor.note = "mpi4py missing, and libopenmpi-dev missing while not root: " \
                              "run 'sudo apt-get install -y libopenmpi-dev', then pip install mpi4py"
                return anchor
            policy = command_output(["apt-cache", "policy", "libopenmpi-dev"])
            log.append(f"$ apt-cache policy libopenmpi-dev\n{policy}")
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            note("installing libopenmpi-dev (for mpi4py's build): apt-get update && apt-get install -y ...")
            for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "libopenmpi-dev"]):
                failed = _run_logged(argv, log, 900, env)
                if failed:
                    anchor.note = f"{failed} (log: {_install_log('mpi4py', chr(10).join(log))}); mpi4py skipped"
                    return anchor
        note(f"building mpi4py against Open MPI into {sys.prefix}: pip install --no-binary mpi4py mpi4py ...")
        failed = _run_logged([sys.executable, "-m", "pip", "install", "--no-binary", "mpi4py", "mpi4py"], log, 1800)
        where = _install_log("mpi4py", "\n".join(log))
        if failed:
            anchor.note = f"{failed} (log: {where}); mpi4py skipped"
            return anchor
        version = _mpi4py_version()
    if version is None:
        anchor.note = "mpi4py not importable (apt-get install libopenmpi-dev; pip install mpi4py); mpi4py skipped"
        return anchor
    if "Open MPI" not in version:
        anchor.note = f"mpi4py runs on another MPI than mpirun's Open MPI ({version}); mpi4py skipped"
        return anchor
    anchor.path, anchor.version = mpirun.path, f"mpi4py {version}"
    return anchor


# -- running the workers -------------------------------------------------------------------------


@dataclass
class Cell:
    """One (tool, N, size): per-iteration latencies (max over processes), all rounds pooled."""

    tool: str
    n: int
    nbytes: int
    collective: str = "allreduce"
    max_us: list[float] = field(default_factory=list)
    rank0_us: list[float] = field(default_factory=list)
    round_medians_us: list[float] = field(default_factory=list)
    #: The core round trip before each round's launch (``Launch.core_round_trip_ns``), beside its median.
    round_trips_ns: list[float | None] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def median_us(self) -> float | None:
        return statistics.median(self.max_us) if self.max_us and not self.problems else None

    @property
    def algbw(self) -> float | None:
        """GB/s: bytes / latency."""
        return None if self.median_us is None else self.nbytes / (self.median_us * 1e-6) / 1e9

    @property
    def busbw(self) -> float | None:
        """GB/s: algbw times what each process's links carry per result byte (``BUS_FACTORS``)."""
        return None if self.algbw is None else self.algbw * BUS_FACTORS[self.collective](self.n)


@dataclass
class Launch:
    tool: str
    n: int
    round: int
    command: str
    wall_s: float
    exit_code: int | None
    init_s: float | None = None
    error: str = ""
    #: A cache line's round trip between two CPUs right before the launch (``core_distance``): far apart
    #: (about twice the near figure), every tool's shared-memory copies of 4 MiB and up are slower.
    core_round_trip_ns: float | None = None


def plan_text(plan: dict[int, tuple[int, int]]) -> str:
    return ",".join(f"{nbytes}:{warmup}:{iters}" for nbytes, (warmup, iters) in plan.items())


def tool_argv(tool: str, anchors: dict[str, Anchor], n: int, plan: str, out: Path,
              collective: str = "allreduce") -> list[str]:
    args = ["--plan", plan, "--out", str(out), "--label", tool, "--collective", collective]
    if tool in POPRUN_TOOLS:
        extra = ["--fabric-transport=tcp"] if tool == "poprun-tcp" else []
        worker = "hvd_worker.py" if tool == "hvd" else "poprun_worker.py"
        return poprun_argv(anchors["poprun"], n, extra) + [sys.executable, str(WORKERS / worker), *args]
    if tool == "mpi4py":
        return mpirun_argv(anchors["mpi4py"], n) + [sys.executable, str(WORKERS / "mpi4py_worker.py"), *args]
    if tool == "gloo":
        torchrun = anchors["gloo"]
        return [torchrun.path or "torchrun", "--standalone", torchrun.extra["nproc_flag"], str(n),
                str(WORKERS / "gloo_worker.py"), *args]
    raise ValueError(tool)


def bench(anchors: dict[str, Anchor], tools: list[str], quick: bool,
          collective: str = "allreduce") -> tuple[dict[tuple, Cell], list[Launch]]:
    """Every (tool, N) launched once a round (``rounds_of``), the order rotating; ``collective`` is the one the
    workers time."""
    plan = QUICK_PLAN if quick else FULL_PLAN
    rounds = rounds_of(tools, quick)
    env = {**python_env(), "OMP_NUM_THREADS": "1"}
    cells = {(t, n, b): Cell(t, n, b, collective) for t in tools for n in NS for b in plan}
    launches: list[Launch] = []
    with tempfile.TemporaryDirectory(prefix=f"{collective}-bench-") as tmp:
        for rnd in range(max(rounds.values(), default=0)):
            for n in NS:
                now = [t for t in tools if rnd < rounds[t]]
                first = (rnd + n) % len(now)
                for tool in now[first:] + now[:first]:
                    out = Path(tmp) / f"{tool}-{n}-{rnd}.json"
                    argv = tool_argv(tool, anchors, n, plan_text(plan), out, collective)
                    try:
                        trip = round_trip_ns()
                    except PeerGone:  # (a note about the machine: never a reason to stop the benchmark)
                        trip = None
                    note(f"round {rnd + 1}/{rounds[tool]}, N={n}: {tool}"
                         + (f" (core round trip {trip:.0f} ns)" if trip is not None else ""))
                    wall, code, tail = run_command(argv, env=env, timeout=RUN_TIMEOUT)
                    launch = Launch(tool, n, rnd, " ".join(argv), wall, code, core_round_trip_ns=trip)
                    launches.append(launch)
                    if code != 0 or not out.exists():
                        last = [line for line in tail.strip().splitlines() if line.strip()][-3:]
                        launch.error = (f"hung: killed after {RUN_TIMEOUT:.0f} s" if code is None
                                        else f"exit {code}") + (": " + " | ".join(last) if last else "")
                        note(f"  {tool} N={n} failed: {launch.error[:300]}")
                        for nbytes in plan:
                            cells[(tool, n, nbytes)].problems.append(f"round {rnd + 1}: {launch.error}")
                        continue
                    report = json.loads(out.read_text())
                    launch.init_s = report.get("init_s")
                    for size in report["sizes"]:
                        add_samples(cells[(tool, n, size["bytes"])], size, rnd, trip)
                        if "paired_max_us" in size:
                            twin = cells.setdefault((PAIRED[tool], n, size["bytes"]),
                                                    Cell(PAIRED[tool], n, size["bytes"], collective))
                            add_samples(twin, {**size, "max_us": size["paired_max_us"],
                                               "rank0_us": size["paired_rank0_us"]}, rnd, trip)
    return cells, launches


def rounds_of(tools: Sequence[str], quick: bool) -> dict[str, int]:
    """How many rounds each tool is launched in: ``LATENCY_ROUNDS`` for ``LATENCY_TOOLS`` in a full run."""
    if quick:
        return {t: QUICK_ROUNDS for t in tools}
    return {t: LATENCY_ROUNDS if t in LATENCY_TOOLS else FULL_ROUNDS for t in tools}


def add_samples(cell: Cell, size: dict, rnd: int, trip: float | None = None) -> None:
    """One launch's samples of one size (a worker's JSON ``sizes`` entry, from round ``rnd``, launched after a
    core round trip of ``trip`` ns) into ``cell``."""
    cell.max_us.extend(size["max_us"])
    cell.rank0_us.extend(size["rank0_us"])
    cell.round_medians_us.append(statistics.median(size["max_us"]))
    cell.round_trips_ns.append(trip)
    for rank, problems in size["problems"].items():
        cell.problems.extend(f"round {rnd + 1}, rank {rank}: {p}" for p in problems)


# -- tables ------------------------------------------------------------------------------------------


def fmt_size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def fmt_num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cell_text(cell: Cell | None, value: float | None, digits: int) -> str:
    if cell is None:
        return "skipped"
    if cell.problems:
        return "WRONG" if any("check" in p for p in cell.problems) else "failed"
    return fmt_num(value, digits)


def metric_table(cells: dict[tuple, Cell], tools: list[str], metric: str) -> str:
    """Rows (N, size); a column per tool, then poprun over each anchor."""
    digits = {"median_us": 1, "algbw": 3, "busbw": 3}[metric]
    rows = []
    for n in NS:
        for nbytes in SIZES:
            got = {t: cells.get((t, n, nbytes)) for t in TOOLS}
            if not any(got[t] for t in tools):
                continue
            values = {t: (getattr(c, metric) if c else None) for t, c in got.items()}
            init = paired_value(cells, "poprun", n, nbytes, metric)  # (the persistent call: ``PAIRED``)
            rows.append([n, fmt_size(nbytes)]
                        + [cell_text(got[t], values[t], digits) for t in TOOLS]
                        + [fmt_num(init, digits)]
                        + [fmt_ratio(div(values["poprun"], values[a])) for a in ANCHORS]
                        + [fmt_ratio(div(init, values["mpi4py"]))]
                        + [fmt_ratio(div(values["hvd"], values["poprun-new"]))]
                        + [fmt_ratio(div(values["hvd"], paired_value(cells, "hvd", n, nbytes, metric)))])
    headers = ["N", "size", *TOOLS, "poprun-init", "poprun/mpi4py", "poprun/gloo", "poprun-init/mpi4py",
               "hvd/poprun-new", "hvd/plain, same procs"]
    return format_table(headers, rows, "r" * len(headers))


def paired_value(cells: dict[tuple, Cell], tool: str, n: int, nbytes: int, metric: str) -> float | None:
    """``metric`` of the call ``tool``'s worker timed beside its own (``PAIRED``), or None."""
    twin = cells.get((PAIRED[tool], n, nbytes))
    return None if twin is None or twin.problems else getattr(twin, metric)


def spread_table(cells: dict[tuple, Cell], tools: list[str]) -> str:
    """How steady the medians are: per-round medians, and instance 0's own median beside the max."""
    rows = []
    twins = [PAIRED[t] for t in tools if t in PAIRED]  # (the calls timed beside a tool's own)
    for n in NS:
        for nbytes in SIZES:
            for tool in [*tools, *twins]:
                cell = cells.get((tool, n, nbytes))
                if cell is None or not cell.max_us:
                    continue
                rows.append([n, fmt_size(nbytes), tool,
                             " / ".join(fmt_num(m) for m in cell.round_medians_us),
                             fmt_num(statistics.median(cell.rank0_us)),
                             fmt_num(min(cell.max_us)), len(cell.max_us)])
    headers = ["N", "size", "tool", "round medians (max over procs)", "instance 0 only", "min", "samples"]
    return format_table(headers, rows, "rrl" + "r" * 4)


def state_table(cells: dict[tuple, Cell], launches: list[Launch], sizes: Sequence[int] = SIZES) -> str:
    """poprun's and mpi4py's medians of their rounds' medians, and their ratio, apart for the rounds that drew
    the near state and the far one (``STATE_FAR_FACTOR``; the rounds counted in brackets)."""
    trips = [launch.core_round_trip_ns for launch in launches if launch.core_round_trip_ns]
    if not trips:
        return "  (no core round trips were measured)"
    far_from = min(trips) * STATE_FAR_FACTOR

    def in_state(cell: Cell | None, far: bool) -> list[float]:
        if cell is None or cell.problems:
            return []
        return [m for m, t in zip(cell.round_medians_us, cell.round_trips_ns) if t and (t >= far_from) == far]

    rows = []
    for n in NS:
        for nbytes in sizes:
            row: list[object] = [n, fmt_size(nbytes)]
            for far in (False, True):
                mine, theirs = (in_state(cells.get((t, n, nbytes)), far) for t in ("poprun", "mpi4py"))
                a, b = (statistics.median(v) if v else None for v in (mine, theirs))
                row += [f"{fmt_num(a)} ({len(mine)})", f"{fmt_num(b)} ({len(theirs)})", fmt_ratio(div(a, b))]
            rows.append(row)
    headers = ["N", "size", "near: poprun", "mpi4py", "ratio", "far: poprun", "mpi4py", "ratio"]
    return (f"  far: the core round trip before the launch was at least {far_from:.0f} ns "
            f"({STATE_FAR_FACTOR}x the run's fastest, {min(trips):.0f} ns)\n"
            + format_table(headers, rows, "r" * len(headers)))


def targets(cells: dict[tuple, Cell]) -> list[tuple[str, bool | None, str]]:
    out: list[tuple[str, bool | None, str]] = []
    for n in NS:
        for nbytes in [b for b in SIZES if b >= TARGET_BUSBW_FROM]:
            mine = cells.get(("poprun", n, nbytes))
            measured = {a: cells[(a, n, nbytes)].busbw for a in ANCHORS if (a, n, nbytes) in cells}
            anchors = {a: v for a, v in measured.items() if v is not None}
            name = f"N={n} {fmt_size(nbytes)}: poprun busbw >= best anchor"
            if mine is None or mine.busbw is None or not anchors:
                out.append((name, None, "not measured" if mine is None or mine.busbw is None else "no anchor"))
                continue
            best = max(anchors, key=anchors.__getitem__)
            out.append((name, mine.busbw >= anchors[best],
                        f"{mine.busbw:.3f} vs {best} {anchors[best]:.3f} GB/s ({mine.busbw / anchors[best]:.2f}x)"))
    for n in NS:
        for nbytes in SIZES:
            mpi = cells.get(("mpi4py", n, nbytes))
            limit = TARGET_MPI_LARGE if nbytes >= TARGET_MPI_LARGE_FROM else TARGET_MPI_SMALL
            for tool in ("poprun", "poprun-init"):
                mine = cells.get((tool, n, nbytes))
                ratio = div(mine.median_us if mine else None, mpi.median_us if mpi else None)
                if ratio is None and tool == "poprun-init":
                    continue  # (timed only by the full poprun launch's allreduce)
                out.append((f"N={n} {fmt_size(nbytes)}: {tool} latency <= {limit:.2f}x mpi4py's",
                            None if ratio is None else ratio <= limit,
                            "not measured" if ratio is None else f"{ratio:.3f}x"))
    for n in NS:
        mine = cells.get(("poprun", n, TARGET_SMALL_BYTES))
        name = f"N={n} {fmt_size(TARGET_SMALL_BYTES)}: poprun latency < {TARGET_SMALL_US:.0f} us"
        if mine is None or mine.median_us is None:
            out.append((name, None, "not measured"))
        else:
            out.append((name, mine.median_us < TARGET_SMALL_US, f"{mine.median_us:.1f} us"))
    for n in NS:
        for nbytes in [b for b in SIZES if b >= TARGET_HVD_FROM]:
            hvd, mine = cells.get(("hvd", n, nbytes)), cells.get(("poprun-new", n, nbytes))
            name = f"N={n} {fmt_size(nbytes)}: hvd latency <= {TARGET_HVD_RATIO:.2f}x poprun-new's"
            ratio = div(hvd.median_us if hvd else None, mine.median_us if mine else None)
            out.append((name, None if ratio is None else ratio <= TARGET_HVD_RATIO,
                        "not measured" if ratio is None else f"{ratio:.3f}x"))
            name = f"N={n} {fmt_size(nbytes)}: hvd latency <= {TARGET_HVD_RATIO:.2f}x the plain call's, same processes"
            ratio = div(hvd.median_us if hvd else None, paired_value(cells, "hvd", n, nbytes, "median_us"))
            out.append((name, None if ratio is None else ratio <= TARGET_HVD_RATIO,
                        "not measured" if ratio is None else f"{ratio:.3f}x"))
    bad = [c for c in cells.values() if any("check" in p for p in c.problems)]
    out.append(("every result checked and right", not bad,
                "yes" if not bad else "; ".join(f"{c.tool} N={c.n} {fmt_size(c.nbytes)}" for c in bad)))
    return out


def targets_table(rows: list[tuple[str, bool | None, str]]) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    return format_table(["target", "result", "measured"], [[t, verdict[ok], m] for t, ok, m in rows], "lll")


def fabric_fingerprint() -> str:
    """A short hash of the fabric's sources: they are changing, and untracked, while this is written."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "src" / "simipu" / "fabric").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, one round (a rough look)")
    parser.add_argument("--skip-install", action="store_true",
                        help="do not install missing anchors (Open MPI, libopenmpi-dev, mpi4py, torch)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "allreduce.json", help="where the JSON goes")
    return parser.parse_args(argv)


def print_results(cells: dict[tuple, Cell], tools: list[str], launches: list[Launch]) -> None:
    """The four tables, then the N=4 commands, start-up times and the first problems of each cell."""
    say("1. Median latency per allreduce, us (each iteration: the slowest process)")
    say(metric_table(cells, tools, "median_us"))
    say()
    say("2. Bus bandwidth, GB/s (algbw x 2(N-1)/N)")
    say(metric_table(cells, tools, "busbw"))
    say()
    say("3. Algorithm bandwidth, GB/s (bytes / latency)")
    say(metric_table(cells, tools, "algbw"))
    say("   ratios: poprun (default transport) over the anchor; latency below 1x and bandwidth above 1x favour poprun")
    say()
    say("4. Spread: median of each round, instance 0's own median, fastest iteration (us)")
    say(spread_table(cells, tools))
    say()
    say("5. By the host's state: medians of the rounds' medians, us (rounds), near and far")
    say(state_table(cells, launches))
    say()
    say("Commands (N=4)")
    seen: set[str] = set()
    for launch in launches:
        if launch.n == 4 and launch.tool not in seen:
            seen.add(launch.tool)
            say(f"  {launch.tool}: {launch.command}")
    inits: dict[tuple[str, int], list[float]] = {}
    for launch in launches:
        if launch.init_s is not None:
            inits.setdefault((launch.tool, launch.n), []).append(launch.init_s)
    say("  start-up to first barrier (init, s): " + ", ".join(
        f"{t} N={n} {statistics.median(v):.2f}" for (t, n), v in sorted(inits.items())))
    for cell in cells.values():
        for problem in cell.problems[:2]:
            say(f"  {cell.tool} N={cell.n} {fmt_size(cell.nbytes)}: {problem[:300]}")
    say()


def json_report(anchors: dict[str, Anchor], fabric: str, quick: bool, plan: dict[int, tuple[int, int]], rounds: int,
                cells: dict[tuple, Cell], launches: list[Launch], target_rows: list[tuple[str, bool | None, str]],
                timing: tuple[float, tuple[float, float, float], tuple[float, float, float]]) -> dict[str, Any]:
    """What benchmarks/results/allreduce.json holds: the machine, the plan, every cell's figures and samples.
    ``timing``: the run's seconds, and the load averages before and after it."""
    elapsed, load, load_after = timing
    return {
        "machine": machine_info(anchors),
        "fabric_sources_sha256_12": fabric,
        "mode": "quick" if quick else "full",
        "elapsed_s": elapsed,
        "loadavg_before": load,
        "loadavg_after": load_after,
        "plan": {str(b): {"warmup": w, "iters": k} for b, (w, k) in plan.items()},
        "rounds": rounds,
        **({} if quick else {"latency_rounds": {"tools": list(LATENCY_TOOLS), "rounds": LATENCY_ROUNDS}}),
        "summary": [
            {"tool": c.tool, "n": c.n, "bytes": c.nbytes, "median_us": c.median_us, "algbw_gbs": c.algbw,
             "busbw_gbs": c.busbw, "rank0_median_us": statistics.median(c.rank0_us) if c.rank0_us else None,
             "round_medians_us": c.round_medians_us, "round_trips_ns": c.round_trips_ns, "problems": c.problems}
            for c in cells.values()
        ],
        "targets": [{"target": t, "pass": ok, "measured": m} for t, ok, m in target_rows],
        "launches": [asdict(launch) for launch in launches],
        "samples": [{"tool": c.tool, "n": c.n, "bytes": c.nbytes, "max_us": c.max_us, "rank0_us": c.rank0_us}
                    for c in cells.values()],
    }


def find_anchors(skip_install: bool) -> dict[str, Anchor] | None:
    """poprun, mpirun, mpi4py and torchrun (as "gloo"), installed first unless ``skip_install``; None (and a
    note) without poprun."""
    poprun = find_poprun()
    if poprun.path is None:
        note(poprun.note)
        return None
    mpirun = ensure_mpirun(skip_install)
    torchrun = ensure_torchrun(skip_install)
    torchrun.name = "gloo"
    return {"poprun": poprun, "mpirun": mpirun, "mpi4py": ensure_mpi4py(mpirun, skip_install), "gloo": torchrun}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    anchors = find_anchors(args.skip_install)
    if anchors is None:
        return 2
    tools = [t for t in TOOLS if anchors["poprun" if t in POPRUN_TOOLS else t].path]
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    rounds = QUICK_ROUNDS if args.quick else FULL_ROUNDS

    git = git_state()
    fabric = fabric_fingerprint()
    say(f"poprun-py allreduce benchmark ({'quick' if args.quick else 'full'}), float32 sum, {CORES} cores, "
        f"Python {sys.version.split()[0]}, commit {git['commit']}"
        + (" (src/ modified)" if git["src_modified"] == "yes" else "") + f", fabric sources {fabric}")
    for key in ("poprun", "mpi4py", "gloo"):
        a = anchors[key]
        say(f"  {key:7} {a.path + '  (' + a.version + ')' if a.path else 'SKIPPED: ' + a.note}")
    load = os.getloadavg()
    say(f"  load average before: {load[0]:.2f} (1 min); other jobs on the {CORES} cores skew every column")
    say("  per launch (warm-up + timed calls): "
        + ", ".join(f"{fmt_size(b)} {w}+{k}" for b, (w, k) in plan.items())
        + f"; {rounds} round(s) per tool and N" + ("" if args.quick else f" ({LATENCY_ROUNDS} for "
                                                     f"{' and '.join(LATENCY_TOOLS)})"))
    say()

    cells, launches = bench(anchors, tools, args.quick)

    print_results(cells, tools, launches)

    target_rows = targets(cells)
    say("Targets")
    say(targets_table(target_rows))
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    say(f"\n(benchmark took {elapsed:.0f} s; load average after: {load_after[0]:.2f}, 1 min)")

    report = json_report(anchors, fabric, args.quick, plan, rounds, cells, launches, target_rows,
                         (elapsed, load, load_after))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    say(f"JSON: {args.output}")
    from plot import plot_after_run  # benchmarks/plot.py: the PNG beside the JSON, if matplotlib is installed

    plot_after_run(args.output, "allreduce.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
