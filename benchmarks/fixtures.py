"""Fixture benchmark: N tests x 4 instances through the poprun pytest plugin, beside torch's harness.

The same test, N times (default 100): each of 4 processes fills a float32
vector with its rank + 1 + i, sums it across the 4 (allreduce) and checks
the result. Written three ways, each file run by its own ``python -m pytest -q``:

* **pytest alone**: the body once in pytest's own process (no instances, a
  one-process "allreduce"): what pytest itself costs per test;
* **poprun plugin**: ``@pytest.mark.poprun(num_instances=4)`` on a
  parametrized test, ``popdist.collectives.allreduce`` inside; also with
  ``-n 2`` (pytest-xdist, one worker per core);
* **torch MultiProcessTestCase** (torch 2.13.0 CPU): N test methods, each
  spawning 4 processes (its ``_spawn_processes``, the harness's only start
  method) that join a gloo process group over a FileStore and call
  ``dist.all_reduce``.

Figures: the wall time of the whole pytest run (start-up included), per test
(wall / N), and the overhead per test over "pytest alone". The pytest-alone
and plugin runs are interleaved and repeated (medians); the torch run, about
8 s a test here, runs once unless ``--torch-reps`` says otherwise, and its
test count can be lowered with ``--torch-tests`` (its per-test figure does
not depend on N). Targets: the plugin's 100 tests in under 30 s, and at least
5x less time per test than the torch harness.

torch 2.13.0 and expecttest (which ``torch.testing._internal`` imports) are
installed into this interpreter's environment when missing, unless
``--skip-install``. Everything goes to ``benchmarks/results/fixtures.json``.

    .venv/bin/python benchmarks/fixtures.py            # about 15 minutes, most of it torch
    .venv/bin/python benchmarks/fixtures.py --quick    # 10 torch tests, one repetition: about 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from launch import (  # noqa: E402  (the launch benchmark's helpers: same anchors, same conventions)
    CORES,
    RESULTS_DIR,
    Anchor,
    _install_log,
    ensure_torchrun,
    fmt_ratio,
    fmt_s,
    format_table,
    git_state,
    machine_info,
    median,
    note,
    python_env,
    ratio,
    run_command,
    say,
    targets_table,
)

INSTANCES = 4
TARGET_TOTAL_S = 30.0
TARGET_RATIO = 5.0
RUN_TIMEOUT = 3600.0

ALONE = '''
import numpy as np
import pytest


@pytest.mark.parametrize("i", range({n}))
def test_allreduce(i):
    total = np.full(4, 1.0 + i, np.float32)  # one process: the sum is its own vector
    assert total[0] == 1 + i
'''

PLUGIN = '''
import numpy as np
import pytest

import popdist
import popdist.collectives as C


@pytest.mark.parametrize("i", range({n}))
@pytest.mark.poprun(num_instances={instances})
def test_allreduce(i):
    total = C.allreduce(np.full(4, popdist.getInstanceIndex() + 1.0 + i, np.float32))
    assert total[0] == {triangle} + {instances} * i
'''

TORCH = '''
import os

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class AllreduceTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return {instances}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass


def _make(i):
    def test(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        total = torch.full((4,), float(self.rank + 1 + i))
        dist.all_reduce(total)
        assert total[0].item() == {triangle} + {instances} * i
        dist.destroy_process_group()
    return test


for _i in range({n}):
    setattr(AllreduceTest, f"test_allreduce_{{_i:03d}}", _make(_i))
'''


@dataclass
class Suite:
    """One way of writing the tests, and its runs."""

    name: str
    tests: int
    command: str = ""
    walls: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def wall(self) -> float | None:
        return median(self.walls)

    @property
    def per_test(self) -> float | None:
        return self.wall / self.tests if self.wall is not None else None


def write_tests(directory: Path, name: str, template: str, n: int) -> Path:
    path = directory / f"test_{name}.py"
    path.write_text(template.format(n=n, instances=INSTANCES, triangle=INSTANCES * (INSTANCES + 1) // 2))
    return path


def run_suite(suite: Suite, path: Path, extra: Sequence[str] = ()) -> None:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, path.name]
    suite.command = " ".join(["python -m pytest -q", *extra, path.name])
    with tempfile.TemporaryFile() as out:
        wall, code, err = run_command(argv, stdout=out, env=python_env(), timeout=RUN_TIMEOUT, cwd=path.parent)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    passed = re.search(r"(\d+) passed", text)
    if code != 0 or passed is None or int(passed.group(1)) != suite.tests:
        suite.problems.append(f"exit {code}, {passed.group(0) if passed else 'nothing passed'}: "
                              f"{(text + err).strip()[-600:]}")
        note(f"{suite.name}: {suite.problems[-1]}")
        return
    suite.walls.append(wall)
    note(f"{suite.name}: {wall:.2f} s")


def ensure_torch_harness(skip_install: bool) -> Anchor:
    """torch 2.13.0 (via the launch benchmark's installer) and what its test harness imports."""
    anchor = ensure_torchrun(skip_install)
    anchor.name = "torch MultiProcessTestCase"
    if anchor.path is None:
        return anchor
    check = [sys.executable, "-c", "import torch.testing._internal.common_distributed"]
    if subprocess.run(check, capture_output=True).returncode != 0 and not skip_install:
        note("installing expecttest (torch.testing._internal imports it) ...")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "expecttest"], capture_output=True, text=True)
        _install_log("expecttest", done.stdout + done.stderr)
    failed = subprocess.run(check, capture_output=True, text=True)
    if failed.returncode != 0:
        anchor.path = None
        anchor.note = f"torch's test harness does not import: {failed.stderr.strip().splitlines()[-1:]}"
    return anchor


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=100, help="tests per plugin run (default 100)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the pytest-alone and plugin runs")
    parser.add_argument("--torch-tests", type=int, default=None, help="tests in the torch run (default: --tests)")
    parser.add_argument("--torch-reps", type=int, default=1, help="repetitions of the torch run (default 1)")
    parser.add_argument("--quick", action="store_true", help="one repetition, 10 torch tests")
    parser.add_argument("--skip-install", action="store_true", help="do not install torch or expecttest")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "fixtures.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.torch_tests = 1, args.torch_tests or 10
    args.torch_tests = args.torch_tests or args.tests
    return args


def print_suites(suites: list[Suite], alone: Suite) -> None:
    """The table of suites (wall time, per test, overhead over pytest alone), then each one's command and problems."""
    rows = []
    for suite in suites:
        overhead = suite.per_test - alone.per_test if suite.per_test is not None and alone.per_test is not None else None
        rows.append([suite.name, suite.tests, fmt_s(suite.wall), f"{suite.per_test * 1000:.0f} ms" if suite.per_test else "n/a",
                     f"{overhead * 1000:.0f} ms" if overhead is not None and suite is not alone else "",
                     len(suite.walls)])
    say(format_table(["tests written for", "tests", "wall (median)", "per test", "overhead/test", "runs"], rows))
    for suite in suites:
        say(f"   {suite.name}: {suite.command}")
        for problem in suite.problems:
            say(f"   {suite.name} FAILED: {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch = ensure_torch_harness(args.skip_install)
    git = git_state()
    say(f"poprun-py fixture benchmark: {args.tests} tests x {INSTANCES} instances, {CORES} cores, "
        f"Python {sys.version.split()[0]}, commit {git['commit']}"
        + (" (src/ modified)" if git["src_modified"] == "yes" else ""))
    say(f"  torch: {torch.version if torch.path else 'SKIPPED: ' + torch.note}")
    load_before = os.getloadavg()
    say(f"  load average before: {' '.join(f'{x:.2f}' for x in load_before)} (other jobs on the machine shift every figure)")
    say()
    alone = Suite("pytest alone (1 process)", args.tests)
    plugin = Suite(f"poprun plugin ({INSTANCES} instances)", args.tests)
    xdist = Suite(f"poprun plugin, -n {CORES} (xdist)", args.tests)
    harness = Suite(f"torch MultiProcessTestCase ({INSTANCES} processes)", args.torch_tests)
    with tempfile.TemporaryDirectory(prefix="poprun-fixtures-") as tmp:
        directory = Path(tmp)
        files = {
            "alone": write_tests(directory, "alone", ALONE, args.tests),
            "plugin": write_tests(directory, "plugin", PLUGIN, args.tests),
            "torch": write_tests(directory, "torch", TORCH, args.torch_tests),
        }
        for _ in range(args.reps):  # interleaved, so machine noise hits all alike
            run_suite(alone, files["alone"])
            run_suite(plugin, files["plugin"])
            run_suite(xdist, files["plugin"], ("-n", str(CORES)))
        if torch.path is not None:
            for _ in range(args.torch_reps):
                run_suite(harness, files["torch"])
    load_after = os.getloadavg()
    suites = [alone, plugin, xdist] + ([harness] if torch.path else [])
    print_suites(suites, alone)
    speedup = ratio(harness.per_test, plugin.per_test)
    say()
    say(f"torch harness per test / poprun plugin per test: {fmt_ratio(speedup)}")
    targets = [
        (f"{args.tests} tests x {INSTANCES} instances under {TARGET_TOTAL_S:.0f} s",
         None if plugin.wall is None else plugin.wall < TARGET_TOTAL_S, fmt_s(plugin.wall)),
        (f"at least {TARGET_RATIO:.0f}x faster per test than the torch harness",
         None if speedup is None else speedup >= TARGET_RATIO, fmt_ratio(speedup)),
    ]
    say(targets_table(targets))
    say(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine_info({"torch": torch}),
        "suites": [asdict(s) | {"wall_median": s.wall, "per_test": s.per_test} for s in suites],
        "torch_over_plugin_per_test": speedup,
        "load_average": {"before": load_before, "after": load_after},
        "targets": [{"target": t, "met": ok, "measured": m} for t, ok, m in targets],
        "seconds": time.perf_counter() - started,
    }, indent=2) + "\n")
    say(f"(written to {args.output}; {time.perf_counter() - started:.0f} s in all)")
    return 0 if all(not s.problems for s in suites) else 1


if __name__ == "__main__":
    sys.exit(main())
