"""Launch benchmark: poprun-py against the launchers people compare it with.

What it measures, side by side in one run:

1. Launch wall time of a trivial job (``true``) for N = 2, 16 and 64 instances:

   * ``poprun --offline-mode=1 --num-instances N --num-replicas N true``
   * ``mpirun -np N true`` (Open MPI from Debian; ``--allow-run-as-root`` as
     root, ``--oversubscribe`` when N exceeds the cores)
   * ``torchrun --nproc-per-node N --no-python true`` (torch 2.13.0, CPU)

   Each repetition runs every tool once, in a rotating order, so machine noise
   hits all of them alike; one unmeasured warm-up run per tool and N comes
   first. The table shows medians and the ratios poprun/mpirun and
   poprun/torchrun. Exits are caught through a pidfd, not ``Popen.wait``'s
   sleep-polling (which rounds up by as much as 50 ms). A run that does not
   end within its timeout is killed and counted as hung, outside the median.

2. Tagged-output throughput: 4 instances each write 250,000 lines
   ``<rank> <seq>`` (rank from OMPI_COMM_WORLD_RANK) through
   ``poprun ... --mpi-global-args=--tag-output`` and ``mpirun --tag-output``,
   stdout to a file. Three C-speed writers (a Python one-shot write, ``seq -f``,
   ``seq | awk``) are first timed alone, no launcher, one file each: that is
   the ceiling, and the cheapest one feeds the launchers. Every
   ``[1,r]<stdout>:r seq`` line is checked: lost, duplicated, torn (malformed)
   and reordered lines are counted. lines/s = all lines / wall time, launch
   included.

3. Where poprun's own time goes at N=2: interpreter start-up, imports, the
   whole launch, and the launch without a bytecode cache for the project's
   modules (as under PYTHONDONTWRITEBYTECODE=1 with an editable install).

Anchors missing on this machine are installed first (skip with
``--skip-install``): ``apt-get install -y openmpi-bin`` (as root) and
``pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu`` (the CPU
build, never PyPI's CUDA one; a local ``+cpu`` wheel in pip's find-links does too) into this
interpreter's environment. An anchor
that cannot be had is skipped with a note; the rest still runs.

Run it with the project's interpreter, so that ``poprun`` and ``torchrun`` are
the ones beside it::

    .venv/bin/python benchmarks/launch.py            # full run, about 3 minutes
    .venv/bin/python benchmarks/launch.py --quick    # fewer repetitions
    .venv/bin/python benchmarks/launch.py --skip-install
    .venv/bin/python benchmarks/launch.py --sizes 2 --launch-only   # the N=2 pairing alone, under a minute
    .venv/bin/python benchmarks/launch.py --sizes 2 --launch-only --baseline /tmp/base   # before/after

``--baseline DIR`` times a second poprun-py source tree (``DIR/src`` first on
PYTHONPATH, through the same ``poprun`` script) interleaved with the others, so
that a change is measured against the code before it in one run, e.g. after
``git archive main src | tar -x -C /tmp/base``.

Plain tables go to stdout; everything (raw samples included) also goes to
``benchmarks/results/launch.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
BIN_DIR = Path(sys.executable).parent
TORCH_VERSION = "2.13.0"
#: torch's CPU build: ``+cpu`` matches no wheel of PyPI's (whose Linux ones pull several GB of CUDA packages),
#: only the CPU index's or a local ``+cpu`` wheel in pip's find-links.
TORCH_CPU = f"torch=={TORCH_VERSION}+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CORES = os.cpu_count() or 1

LAUNCH_SIZES = (2, 16, 64)
#: Repetitions per N: (poprun and mpirun, torchrun). torchrun costs ~2 s a run.
FULL_REPS = {2: (21, 9), 16: (15, 7), 64: (11, 5)}
QUICK_REPS = {2: (5, 3), 16: (3, 2), 64: (3, 2)}
#: Seconds before a launch of ``true`` is killed and counted as hung (mpirun 4.1 sometimes
#: never returns when 32+ instances exit at once); torchrun gets longer.
LAUNCH_TIMEOUT = 5.0
TORCHRUN_TIMEOUT = 60.0
RUN_TIMEOUT = 120.0  # any other run

TP_INSTANCES = 4
TP_LINES = 250_000
TP_REPS_FULL = 5
TP_REPS_QUICK = 1
TARGET_LINES_PER_S = 1_000_000

#: poprun-py is an editable install: without a bytecode cache every launch compiles
#: its modules again. Where the environment forbids writing bytecode next to the
#: sources (PYTHONDONTWRITEBYTECODE), poprun's runs cache it under results/ instead,
#: as a normal install would have it; the breakdown shows the price of not doing so.
PYCACHE_DIR = RESULTS_DIR / "pycache"


# -- small helpers ---------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def note(text: str) -> None:
    """A progress or warning line, on stderr so stdout stays the tables."""
    print(f"# {text}", file=sys.stderr, flush=True)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A plain, aligned text table; ``align`` has one 'l' or 'r' per column (default: 'l' then 'r's)."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}s"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.2f}M"


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def wait_exact(proc: subprocess.Popen, timeout: float) -> int | None:
    """Wait for ``proc`` to exit, waking at once when it does; None after ``timeout`` seconds.

    ``Popen.wait(timeout=...)`` polls with sleeps of up to 50 ms, which would round
    every launch time up to the next poll: a pidfd wakes the moment the process exits.
    """
    pidfd = os.pidfd_open(proc.pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return proc.wait() if ready else None


def run_command(
    argv: Sequence[str],
    *,
    stdout: Any = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    timeout: float = RUN_TIMEOUT,
    cwd: str | Path | None = None,
) -> tuple[float, int | None, str]:
    """Run ``argv`` in a session of its own; return (wall seconds, exit code, stderr tail).

    On timeout the whole session (and only it) is killed and the code is None (hung).
    """
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        code = wait_exact(proc, timeout)
        wall = time.perf_counter() - start
        if code is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace")
    return wall, code, tail


def command_output(argv: Sequence[str], timeout: float = 120.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"<{exc}>"
    return (done.stdout + done.stderr).strip()


# -- anchors: finding and installing them ------------------------------------------------


@dataclass
class Anchor:
    """One launcher to compare with; ``path`` None means it is skipped (see ``note``)."""

    name: str
    path: str | None = None
    version: str = ""
    note: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def python_env(bytecode_cache: bool = True) -> dict[str, str]:
    """The environment for poprun and the Python steps.

    With ``bytecode_cache``, compiled modules are cached (under results/ if the
    environment forbids writing them beside the sources); without, the project's
    own modules are compiled at every start, as under PYTHONDONTWRITEBYTECODE=1
    with no .pyc written yet (installed packages keep the .pyc pip wrote).
    """
    env = dict(os.environ)
    if bytecode_cache:
        if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
            env["PYTHONPYCACHEPREFIX"] = str(PYCACHE_DIR)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def baseline_env(baseline: Path | None) -> dict[str, str] | None:
    """poprun's environment with another source tree's ``src/`` first on the path (``--baseline``)."""
    if baseline is None:
        return None
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(baseline.resolve() / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def find_poprun() -> Anchor:
    beside = BIN_DIR / "poprun"
    path = str(beside) if beside.exists() else shutil.which("poprun")
    if path is None:
        return Anchor("poprun", note=f"no poprun beside {sys.executable} nor on PATH: pip install -e . first")
    return Anchor("poprun", path, command_output([path, "--version"]).splitlines()[0])


def _install_log(name: str, text: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"install-{name}.log"
    path.write_text(text)
    return path


def ensure_mpirun(skip_install: bool) -> Anchor:
    """Open MPI's mpirun, from Debian's openmpi-bin when missing and we are root."""
    anchor = Anchor("mpirun")
    path = shutil.which("mpirun")
    if path is None and not skip_install:
        if os.geteuid() != 0:
            anchor.note = "mpirun missing and not root: run 'sudo apt-get install -y openmpi-bin'"
            return anchor
        note("installing Open MPI: apt-get update && apt-get install -y openmpi-bin ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        log = []
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "openmpi-bin"]):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as exc:
                anchor.note = f"{' '.join(argv)} failed: {exc}"
                return anchor
            log.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                where = _install_log("openmpi", "\n".join(log))
                anchor.note = f"'{' '.join(argv)}' exited {done.returncode} (log: {where})"
                return anchor
        _install_log("openmpi", "\n".join(log))
        path = shutil.which("mpirun")
    if path is None:
        anchor.note = anchor.note or "mpirun not found (install: apt-get install -y openmpi-bin)"
        return anchor
    anchor.path = path
    anchor.version = command_output([path, "--version"]).splitlines()[0]
    return anchor


def mpirun_argv(anchor: Anchor, n: int, extra: Sequence[str] = ()) -> list[str]:
    argv = [anchor.path or "mpirun"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if n > CORES:
        argv.append("--oversubscribe")
    return [*argv, *extra, "-np", str(n)]


def _torch_version() -> str | None:
    """The torch version installed for this interpreter, without importing it here."""
    code = "import importlib.metadata as m; print(m.version('torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_torchrun(skip_install: bool) -> Anchor:
    """torchrun from torch 2.13.0 (CPU) in this interpreter's environment."""
    anchor = Anchor("torchrun")
    version = _torch_version()
    if version is None and not skip_install:
        note(f"installing {TORCH_CPU} into {sys.prefix} (from {TORCH_CPU_INDEX} or a local +cpu wheel) ...")
        argv = [sys.executable, "-m", "pip", "install", TORCH_CPU, "--extra-index-url", TORCH_CPU_INDEX]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            where = _install_log("torch", f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                anchor.note = f"pip install {TORCH_CPU} exited {done.returncode} (log: {where}); torchrun skipped"
                return anchor
        except (OSError, subprocess.TimeoutExpired) as exc:
            anchor.note = f"pip install {TORCH_CPU} failed ({exc}); torchrun skipped"
            return anchor
        version = _torch_version()
    if version is None:
        anchor.note = f"torch not installed (pip install {TORCH_CPU} --extra-index-url {TORCH_CPU_INDEX}); torchrun skipped"
        return anchor
    if version.split("+")[0] != TORCH_VERSION:
        anchor.note = f"torch {version} installed, not {TORCH_VERSION}; torchrun skipped (left untouched)"
        return anchor
    path = BIN_DIR / "torchrun"
    if not path.exists():
        anchor.note = f"torch {version} is installed but {path} is missing; torchrun skipped"
        return anchor
    help_text = command_output([str(path), "--help"])
    if "--no-python" in help_text:
        flag = "--no-python"
    elif "--no_python" in help_text:
        flag = "--no_python"
    else:
        anchor.note = "torchrun --help names neither --no-python nor --no_python; torchrun skipped"
        return anchor
    nproc = "--nproc-per-node" if "--nproc-per-node" in help_text else "--nproc_per_node"
    anchor.path, anchor.version = str(path), f"torch {version}"
    anchor.extra = {"no_python_flag": flag, "nproc_flag": nproc}
    return anchor


def torchrun_argv(anchor: Anchor, n: int) -> list[str]:
    return [anchor.path or "torchrun", anchor.extra["nproc_flag"], str(n), anchor.extra["no_python_flag"]]


def poprun_argv(anchor: Anchor, n: int, extra: Sequence[str] = ()) -> list[str]:
    return [anchor.path or "poprun", "--offline-mode=1", "--num-instances", str(n), "--num-replicas", str(n), *extra]


# -- 1. launch wall time -------------------------------------------------------------------


@dataclass
class LaunchResult:
    n: int
    tool: str
    command: str
    samples: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    hung: int = 0  # runs killed after the timeout; not in the median

    @property
    def median(self) -> float | None:
        return median(self.samples)


def bench_launch(anchors: dict[str, Anchor], quick: bool, sizes: Sequence[int] = LAUNCH_SIZES,
                 baseline: Path | None = None) -> list[LaunchResult]:
    """Interleaved, order-rotating repetitions of every available launcher (and the baseline), per N."""
    builders: dict[str, Callable[[int], list[str]]] = {
        "poprun": lambda n: poprun_argv(anchors["poprun"], n) + ["true"],
        "baseline": lambda n: poprun_argv(anchors["poprun"], n) + ["true"],
        "mpirun": lambda n: mpirun_argv(anchors["mpirun"], n) + ["true"],
        "torchrun": lambda n: torchrun_argv(anchors["torchrun"], n) + ["true"],
    }
    envs = {"poprun": python_env(), "baseline": baseline_env(baseline), "mpirun": None, "torchrun": None}
    timeouts = {"poprun": LAUNCH_TIMEOUT, "baseline": LAUNCH_TIMEOUT, "mpirun": LAUNCH_TIMEOUT,
                "torchrun": TORCHRUN_TIMEOUT}
    tools = [t for t in ("poprun", "mpirun", "torchrun") if anchors[t].path]
    if baseline is not None:
        tools.insert(1, "baseline")
    results: list[LaunchResult] = []
    for n in sizes:
        reps, torch_reps = (QUICK_REPS if quick else FULL_REPS)[n]
        by_tool = {t: LaunchResult(n, t, " ".join(builders[t](n))) for t in tools}
        note(f"launch N={n}: {reps} repetitions ({torch_reps} for torchrun), after one warm-up each")
        for tool in tools:  # warm-up: page cache, Python bytecode caches
            run_command(builders[tool](n), env=envs[tool], timeout=timeouts[tool])
        for rep in range(reps):
            order = tools[rep % len(tools):] + tools[: rep % len(tools)]
            for tool in order:
                if tool == "torchrun" and rep >= torch_reps:
                    continue
                wall, code, tail = run_command(builders[tool](n), env=envs[tool], timeout=timeouts[tool])
                if code == 0:
                    by_tool[tool].samples.append(wall)
                elif code is None:
                    by_tool[tool].hung += 1
                else:
                    last = tail.strip().splitlines()[-1:] or [""]
                    by_tool[tool].failures.append(f"exit {code}: {last[0][:200]}")
        results.extend(by_tool.values())
    return results


def launch_table(results: list[LaunchResult]) -> tuple[str, list[dict[str, Any]]]:
    def cell(r: LaunchResult | None) -> str:
        if r is None:
            return "skipped"
        text = fmt_s(r.median)
        if r.hung:
            text += f" ({r.hung} hung)"
        return f"{text} ({len(r.failures)} failed)" if r.failures else text

    rows, summary = [], []
    for n in sorted({r.n for r in results}):
        got = {r.tool: r for r in results if r.n == n}
        medians = {t: (got[t].median if t in got else None) for t in ("poprun", "mpirun", "torchrun")}
        rows.append([
            n,
            cell(got.get("poprun")),
            cell(got.get("mpirun")),
            cell(got.get("torchrun")),
            fmt_ratio(ratio(medians["poprun"], medians["mpirun"])),
            fmt_ratio(ratio(medians["poprun"], medians["torchrun"])),
            "/".join(str(len(got[t].samples)) if t in got else "-" for t in ("poprun", "mpirun", "torchrun")),
        ])
        summary.append({
            "n": n,
            **{f"{t}_median_s": m for t, m in medians.items()},
            **{f"{t}_unfinished": len(r.failures) + r.hung for t, r in got.items()},
            "poprun_over_mpirun": ratio(medians["poprun"], medians["mpirun"]),
            "poprun_over_torchrun": ratio(medians["poprun"], medians["torchrun"]),
        })
    headers = ["N", "poprun", "mpirun", "torchrun", "poprun/mpirun", "poprun/torchrun", "runs p/m/t"]
    return format_table(headers, rows, "r" * len(headers)), summary


def baseline_table(results: list[LaunchResult], summary: list[dict[str, Any]]) -> str:
    """poprun against the ``--baseline`` tree per N; adds the baseline's figures to ``summary``."""
    rows = []
    for row in summary:
        base = next((r for r in results if r.n == row["n"] and r.tool == "baseline"), None)
        base_median = base.median if base is not None else None
        row["baseline_median_s"] = base_median
        row["baseline_over_mpirun"] = ratio(base_median, row["mpirun_median_s"])
        row["poprun_over_baseline"] = ratio(row["poprun_median_s"], base_median)
        rows.append([row["n"], fmt_s(base_median), fmt_s(row["poprun_median_s"]),
                     fmt_ratio(row["baseline_over_mpirun"]), fmt_ratio(row["poprun_over_mpirun"]),
                     fmt_ratio(row["poprun_over_baseline"]), len(base.samples) if base is not None else 0])
    headers = ["N", "baseline", "poprun", "baseline/mpirun", "poprun/mpirun", "poprun/baseline", "baseline runs"]
    return format_table(headers, rows, "r" * len(headers))


def launch_targets(summary: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    by_n = {row["n"]: row for row in summary}
    two, big = by_n.get(2, {}), by_n.get(64, {})

    def check(value: float | None, limit: float, row: dict[str, Any]) -> bool | None:
        """Under the limit, and no poprun run failed or hung at that N."""
        return None if value is None else value < limit and not row.get("poprun_unfinished")

    pm, pt, p64 = two.get("poprun_over_mpirun"), two.get("poprun_over_torchrun"), big.get("poprun_median_s")
    return [
        ("N=2: poprun within 2x mpirun", check(pm, 2.0, two), fmt_ratio(pm)),
        ("N=2: poprun under 0.1x torchrun", check(pt, 0.1, two), fmt_ratio(pt)),
        ("N=64: poprun under 1 s", check(p64, 1.0, big), fmt_s(p64)),
    ]


# -- 2. tagged-output throughput -------------------------------------------------------------

#: Writers of ``<rank> <seq>\n`` lines, rank from OMPI_COMM_WORLD_RANK (both launchers set it).
#: Each is measured alone; the cheapest feeds the launchers.
WRITER_SOURCES: dict[str, Callable[[int], list[str]]] = {
    "python-block": lambda lines: [
        sys.executable, "-I", "-S", "-c",  # not a pyenv shim on PATH: that is a bash script
        "import os,sys\n"
        "p=os.environ.get('OMPI_COMM_WORLD_RANK','0')+' '\n"
        f"sys.stdout.buffer.write((p+('\\n'+p).join(map(str,range({lines})))+'\\n').encode())",
    ],
    "seq-format": lambda lines: [
        "sh", "-c", f'exec seq -f "${{OMPI_COMM_WORLD_RANK:-0}} %.0f" 0 {lines - 1}',
    ],
    "seq-awk": lambda lines: [
        "sh", "-c", f'seq 0 {lines - 1} | awk -v r="${{OMPI_COMM_WORLD_RANK:-0}}" \'{{print r, $1}}\'',
    ],
}

_TAGGED = re.compile(rb"\[1,(\d+)\]<stdout>:(\d+) (\d+)")
_PLAIN = re.compile(rb"(\d+) (\d+)")


@dataclass
class Integrity:
    """What a check of the output found, against instances x lines expected."""

    lines: int = 0
    lost: int = 0
    duplicated: int = 0
    torn: int = 0  # lines that are not exactly one well-formed, consistent record
    reordered: int = 0  # records whose seq is below one already seen from that rank

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.torn or self.reordered)


def check_output(data: bytes, instances: int, lines: int, tagged: bool) -> Integrity:
    """Every ``[1,r]<stdout>:r seq`` (or ``r seq``) present once, in order per rank?"""
    result = Integrity()
    rows = data.split(b"\n")
    if rows and rows[-1] == b"":
        rows.pop()
    elif rows:
        result.torn += 1  # a last line without its newline
        rows.pop()
    result.lines = len(rows)
    seen = [bytearray(lines) for _ in range(instances)]
    last = [-1] * instances
    pattern = _TAGGED if tagged else _PLAIN
    for row in rows:
        match = pattern.fullmatch(row)
        if match is None:
            result.torn += 1
            continue
        if tagged:
            tag, rank, seq = (int(g) for g in match.groups())
            if tag != rank:
                result.torn += 1
                continue
        else:
            rank, seq = (int(g) for g in match.groups())
        if not (0 <= rank < instances and 0 <= seq < lines):
            result.torn += 1
            continue
        if seen[rank][seq]:
            result.duplicated += 1
            continue
        seen[rank][seq] = 1
        if seq < last[rank]:
            result.reordered += 1
        last[rank] = max(last[rank], seq)
    result.lost = sum(lines - sum(s) for s in seen)
    return result


@dataclass
class ThroughputRun:
    wall_s: float
    exit_code: int
    lines_per_s: float
    mb_per_s: float
    integrity: Integrity
    stderr_tail: str = ""


@dataclass
class ThroughputResult:
    name: str
    command: str
    runs: list[ThroughputRun] = field(default_factory=list)

    @property
    def median_rate(self) -> float | None:
        return median([r.lines_per_s for r in self.runs if r.exit_code == 0])

    @property
    def median_wall(self) -> float | None:
        return median([r.wall_s for r in self.runs if r.exit_code == 0])

    def total(self, attr: str) -> int:
        return sum(getattr(r.integrity, attr) for r in self.runs)


def writers_alone(argv: list[str], instances: int, lines: int, workdir: Path) -> ThroughputRun:
    """The writers with no launcher: all started at once, one file each; the ceiling."""
    paths = [workdir / f"alone.{r}" for r in range(instances)]
    files = [open(path, "wb") for path in paths]
    try:
        start = time.perf_counter()
        procs = [
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=files[r],
                             env={**os.environ, "OMPI_COMM_WORLD_RANK": str(r)})
            for r in range(instances)
        ]
        codes = [wait_exact(proc, RUN_TIMEOUT) for proc in procs]
        wall = time.perf_counter() - start
        for proc, code in zip(procs, codes):
            if code is None:
                proc.kill()
                proc.wait()
    finally:
        for f in files:
            f.close()
    data = b"".join(path.read_bytes() for path in paths)
    integrity = check_output(data, instances, lines, tagged=False)
    worst = max((-9 if c is None else c for c in codes), key=abs)
    return ThroughputRun(wall, worst, instances * lines / wall, len(data) / wall / 1e6, integrity)


def launched(
    argv: list[str], instances: int, lines: int, workdir: Path, env: dict[str, str] | None = None
) -> ThroughputRun:
    """One launcher run with stdout to a file; then every line is checked."""
    out_path = workdir / "launched.out"
    with open(out_path, "wb") as out:
        wall, code, tail = run_command(argv, stdout=out, env=env)
    data = out_path.read_bytes()
    integrity = check_output(data, instances, lines, tagged=True)
    out_path.unlink()
    total = instances * lines
    code = -9 if code is None else code
    return ThroughputRun(wall, code, total / wall, len(data) / wall / 1e6, integrity, tail[-500:] if code else "")


def bench_throughput(anchors: dict[str, Anchor], quick: bool) -> tuple[dict[str, ThroughputResult], str]:
    """Writers alone (each candidate), then poprun and mpirun interleaved with the cheapest."""
    reps = TP_REPS_QUICK if quick else TP_REPS_FULL
    results: dict[str, ThroughputResult] = {}
    with tempfile.TemporaryDirectory(prefix="poprun-bench-") as tmp:
        workdir = Path(tmp)
        note(f"throughput: writers alone ({TP_INSTANCES} x {TP_LINES:,} lines), {reps + 1} runs each")
        for name, build in WRITER_SOURCES.items():
            argv = build(TP_LINES)
            result = ThroughputResult(f"writer alone: {name}", " ".join(argv))
            writers_alone(argv, TP_INSTANCES, TP_LINES, workdir)  # warm-up
            for _ in range(reps):
                result.runs.append(writers_alone(argv, TP_INSTANCES, TP_LINES, workdir))
            results[result.name] = result
        fastest = min(WRITER_SOURCES, key=lambda w: results[f"writer alone: {w}"].median_wall or float("inf"))
        writer = WRITER_SOURCES[fastest](TP_LINES)
        commands: dict[str, list[str]] = {}
        if anchors["poprun"].path:
            commands["poprun --tag-output"] = poprun_argv(anchors["poprun"], TP_INSTANCES,
                                                          ["--mpi-global-args=--tag-output"]) + writer
        if anchors["mpirun"].path:
            commands["mpirun --tag-output"] = mpirun_argv(anchors["mpirun"], TP_INSTANCES, ["--tag-output"]) + writer
        for name, argv in commands.items():
            results[name] = ThroughputResult(name, " ".join(argv))
        note(f"throughput: launchers with writer '{fastest}', {reps} runs each, interleaved")
        for rep in range(reps):
            names = list(commands)
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                env = python_env() if name.startswith("poprun") else None
                results[name].runs.append(launched(commands[name], TP_INSTANCES, TP_LINES, workdir, env))
    return results, fastest


def throughput_table(results: dict[str, ThroughputResult]) -> str:
    rows = []
    for name, r in results.items():
        failed = sum(1 for run in r.runs if run.exit_code != 0)
        mb = median([run.mb_per_s for run in r.runs if run.exit_code == 0])
        rows.append([
            name,
            fmt_s(r.median_wall) + (f" ({failed} failed)" if failed else ""),
            fmt_rate(r.median_rate),
            "n/a" if mb is None else f"{mb:.0f}",
            r.total("lost"), r.total("duplicated"), r.total("torn"), r.total("reordered"),
            len(r.runs),
        ])
    headers = ["run", "wall", "lines/s", "MB/s", "lost", "dup", "torn", "reordered", "runs"]
    return format_table(headers, rows)


def throughput_targets(results: dict[str, ThroughputResult]) -> list[tuple[str, bool | None, str]]:
    r = results.get("poprun --tag-output")
    if r is None or not r.runs:
        return [("tagged output: poprun 0 lost at >= 1M lines/s", None, "not run")]
    rate, lost = r.median_rate, r.total("lost")
    other = f"dup {r.total('duplicated')}, torn {r.total('torn')}, reordered {r.total('reordered')}"
    ok = rate is not None and rate >= TARGET_LINES_PER_S and lost == 0
    return [("tagged output: poprun 0 lost at >= 1M lines/s", ok, f"{fmt_rate(rate)} lines/s, {lost} lost ({other})")]


# -- 3. where poprun's time goes ---------------------------------------------------------------


def bench_breakdown(anchors: dict[str, Anchor], quick: bool) -> tuple[str, list[dict[str, Any]]]:
    """Interpreter start-up, poprun's imports, and the whole N=2 launch, interleaved."""
    reps = 5 if quick else 15
    py = sys.executable
    cached, uncached = python_env(True), python_env(False)
    launch = poprun_argv(anchors["poprun"], 2) + ["true"]
    steps: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass (interpreter start-up)": ([py, "-c", "pass"], cached),
        "python -c 'import typer' (Typer, for --help and usage errors)": ([py, "-c", "import typer"], cached),
        "python -c 'import poprun_py.command' (the command line)": ([py, "-c", "import poprun_py.command"], cached),
        "python -c 'import ...command, ...launcher' (+ launch imports)": (
            [py, "-c", "import poprun_py.command, poprun_py.launcher"], cached),
        "poprun ... N=2 true (whole launch)": (launch, cached),
        "poprun ... N=2 true, PYTHONDONTWRITEBYTECODE=1": (launch, uncached),
        "poprun --help": ([anchors["poprun"].path or "poprun", "--help"], cached),
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for argv, env in steps.values():
        run_command(argv, env=env)  # warm-up
    for rep in range(reps):
        names = list(steps)
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            argv, env = steps[name]
            wall, code, _ = run_command(argv, env=env)
            if code == 0:
                samples[name].append(wall)
    rows, data = [], []
    for name, values in samples.items():
        rows.append([name, fmt_s(median(values)), len(values)])
        data.append({"step": name, "median_s": median(values), "samples": values})
    return format_table(["step", "median", "runs"], rows), data


# -- main ------------------------------------------------------------------------------------------


def targets_table(targets: list[tuple[str, bool | None, str]]) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    return format_table(["target", "result", "measured"], [[t, verdict[ok], m] for t, ok, m in targets], "lll")


def git_state() -> dict[str, str]:
    """The commit measured, and whether src/ differs from it."""
    head = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = command_output(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"])
    return {"commit": head, "src_modified": "yes" if dirty else "no"}


def machine_info(anchors: dict[str, Anchor]) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(),
        "pythondontwritebytecode_in_env": "PYTHONDONTWRITEBYTECODE" in os.environ,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cores": CORES,
        "anchors": {name: asdict(a) for name, a in anchors.items()},
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a rough look in about a minute)")
    parser.add_argument("--skip-install", action="store_true", help="do not install missing anchors (Open MPI, torch)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "launch.json", help="where the JSON goes")
    parser.add_argument("--sizes", type=int, nargs="+", choices=LAUNCH_SIZES, default=list(LAUNCH_SIZES),
                        metavar="N", help=f"the launch sizes to measure (default: {' '.join(map(str, LAUNCH_SIZES))})")
    parser.add_argument("--launch-only", action="store_true",
                        help="skip the tagged-output part (launch times and where poprun's time goes only)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another poprun-py tree whose src/ is timed beside this one (before/after a change)")
    args = parser.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "src" / "poprun_py").is_dir():
        parser.error(f"--baseline {args.baseline}: no src/poprun_py in it")
    return args


def launch_section(anchors: dict[str, Anchor], quick: bool, sizes: Sequence[int],
                   baseline: Path | None = None) -> tuple[list[LaunchResult], list[dict[str, Any]]]:
    """1: each launcher's wall time for `true`, measured and printed, with the commands and any failures."""
    all_results = bench_launch(anchors, quick, sizes, baseline)
    launch_results = [r for r in all_results if r.tool != "baseline"]
    table, launch_summary = launch_table(launch_results)
    say("1. Launch wall time of `true`, median of interleaved runs")
    say(table)
    if baseline is not None:
        say(f"\n   against the baseline ({baseline}/src), in the same interleaved runs:")
        say(baseline_table(all_results, launch_summary))
    for r in launch_results:
        if r.n == max(sizes):
            say(f"   {r.tool}: {r.command}")
    for r in launch_results:
        if r.failures:
            say(f"   {r.tool} N={r.n}: {len(r.failures)} failed runs, e.g. {r.failures[0]}")
        if r.hung:
            say(f"   {r.tool} N={r.n}: {r.hung} of {r.hung + len(r.samples) + len(r.failures)} runs hung "
                f"(killed after {TORCHRUN_TIMEOUT if r.tool == 'torchrun' else LAUNCH_TIMEOUT:.0f} s; "
                "the median is of the runs that finished)")
    say()
    return launch_results, launch_summary


def throughput_section(anchors: dict[str, Anchor], quick: bool) -> tuple[dict[str, ThroughputResult], str]:
    """2: tagged output through each launcher, measured and printed, with Open MPI's losses explained."""
    tp_results, writer = bench_throughput(anchors, quick)
    say(f"2. Tagged output, {TP_INSTANCES} instances x {TP_LINES:,} lines, stdout to a file "
        f"(launchers use the cheapest writer: {writer})")
    say(throughput_table(tp_results))
    for name in ("poprun --tag-output", "mpirun --tag-output"):
        if name in tp_results:
            say(f"   {tp_results[name].command}")
    for r in tp_results.values():
        for run in r.runs:
            if run.exit_code:
                say(f"   {r.name}: exit {run.exit_code}: {run.stderr_tail.strip()[-200:]}")
    mpi = tp_results.get("mpirun --tag-output")
    if mpi is not None and (mpi.total("lost") or mpi.total("torn")):
        say("   mpirun's losses are Open MPI 4.1's own: it tags each read of up to 4 KiB into an 8 KiB buffer\n"
            "   and drops the rest of the read once that is full (ORTE_IOF_BASE_TAGGED_OUT_MAX in\n"
            "   orte/mca/iof/base/iof_base_output.c); the cut also tears the tag it stops in.")
    say()
    return tp_results, writer


def skip_throughput() -> tuple[dict[str, ThroughputResult], str]:
    """2 when --launch-only: said, and nothing measured."""
    say("2. Tagged output: skipped (--launch-only)\n")
    return {}, ""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    anchors = {
        "poprun": find_poprun(),
        "mpirun": ensure_mpirun(args.skip_install),
        "torchrun": ensure_torchrun(args.skip_install),
    }
    if anchors["poprun"].path is None:
        note(anchors["poprun"].note)
        return 2

    git = git_state()
    say(f"poprun-py launch benchmark ({'quick' if args.quick else 'full'}), {CORES} cores, "
        f"Python {sys.version.split()[0]}, commit {git['commit']}"
        + (" (src/ modified)" if git["src_modified"] == "yes" else ""))
    for a in anchors.values():
        say(f"  {a.name:9} {a.path + '  (' + a.version + ')' if a.path else 'SKIPPED: ' + a.note}")
    if "PYTHONDONTWRITEBYTECODE" in os.environ:
        say(f"  (PYTHONDONTWRITEBYTECODE is set here: poprun runs cache bytecode in {PYCACHE_DIR.relative_to(ROOT)}/)")
    say()

    launch_results, launch_summary = launch_section(anchors, args.quick, sorted(set(args.sizes)), args.baseline)
    tp_results, writer = throughput_section(anchors, args.quick) if not args.launch_only else skip_throughput()
    breakdown_table, breakdown = bench_breakdown(anchors, args.quick)
    say("3. Where poprun's N=2 launch time goes (medians)")
    say(breakdown_table)
    say()

    targets = launch_targets(launch_summary) + throughput_targets(tp_results)
    say("Targets")
    say(targets_table(targets))
    elapsed = time.perf_counter() - started
    say(f"\n(benchmark took {elapsed:.0f} s)")

    report = {
        "machine": machine_info(anchors),
        "mode": "quick" if args.quick else "full",
        "elapsed_s": elapsed,
        "launch": {"summary": launch_summary, "runs": [asdict(r) | {"median_s": r.median} for r in launch_results]},
        "throughput": {
            "instances": TP_INSTANCES,
            "lines_per_instance": TP_LINES,
            "writer": writer,
            "results": {
                name: {"command": r.command, "median_wall_s": r.median_wall, "median_lines_per_s": r.median_rate,
                       "runs": [asdict(run) for run in r.runs]}
                for name, r in tp_results.items()
            },
        },
        "breakdown": breakdown,
        "targets": [{"target": t, "pass": ok, "measured": m} for t, ok, m in targets],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    say(f"JSON: {args.output}")
    from plot import plot_after_run  # benchmarks/plot.py: the PNG beside the JSON, if matplotlib is installed

    plot_after_run(args.output, "launch.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
