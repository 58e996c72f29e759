"""The pytest plugin, run on small test files through pytester (a pytest of their own, in a subprocess)."""

from __future__ import annotations

import pytest

from support import RUN_TIMEOUT

pytest_plugins = ["pytester"]

HEADER = """
import os
import time

import numpy as np
import pytest

import popdist
import popdist.collectives as C
"""


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_instances=HEADER + body)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=RUN_TIMEOUT)


def line_of(body: str, text: str) -> int:
    """The line of the test file (as makepyfile writes it) that holds ``text``."""
    lines = (HEADER + body).strip().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def test_a_passing_test_runs_in_every_instance_with_its_own_tmp_path(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.fixture
def settings():
    return {"scale": 3}

@pytest.mark.poprun(num_instances=4, num_replicas=8)
def test_body(tmp_path, tmpdir, settings, monkeypatch):
    i = popdist.getInstanceIndex()
    assert popdist.getNumInstances() == 4 and popdist.getNumLocalReplicas() == 2
    assert tmp_path.name == f"instance{i}" and str(tmpdir) == str(tmp_path)
    assert not any(tmp_path.iterdir())
    (tmp_path / "mine").write_text(str(i * settings["scale"]))
    (tmp_path.parent / f"shared{i}").write_text("")
    print("instance", i, "ran")

def test_afterwards(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "test_body0"
    assert sorted(p.name for p in base.iterdir()) == [
        "instance0", "instance1", "instance2", "instance3", "shared0", "shared1", "shared2", "shared3"]
    assert (base / "instance2" / "mine").read_text() == "6"
""")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*[[]1,2[]]<stdout>:instance 2 ran*"])


def test_one_instance_asserting_fails_the_test_promptly_with_its_assertion(pytester: pytest.Pytester) -> None:
    result = run(pytester, f"""
@pytest.mark.poprun(num_instances=4)
def test_body():
    i = popdist.getInstanceIndex()
    if i != 2:
        time.sleep({RUN_TIMEOUT})  # stopped, not waited for
    assert i * 10 == 21
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_body _*",
        "instance 2 of 4 raised AssertionError: assert (2 [*] 10) == 21 (pid * on localhost)",
        "    def test_body():",
        ">       assert i [*] 10 == 21",
        "E       assert (2 * 10) == 21",
        "test_instances.py:*: AssertionError",
        "stopped as a consequence: instances 0, 1, 3",
        "FAILED test_instances.py::test_body - Failed: instance 2 of 4 raised*",
    ])


FAILS_IN_A_HELPER = """
def check(i):
    assert i != 1, f"instance {i} is wrong"

@pytest.mark.poprun(num_instances=3)
def test_body():
    i = popdist.getInstanceIndex()
    C.barrier()
    check(i)
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_tb_line_points_at_the_line_that_failed_in_the_instance(pytester: pytest.Pytester, xdist: tuple) -> None:
    """As pytest's own: ``path:line: message``, which editors and CI annotations read. Before, the line was
    the plugin's (pytest_plugin.py:112), where the outcome is raised in pytest's process."""
    result = run(pytester, FAILS_IN_A_HELPER, "--tb=line", *xdist)
    result.assert_outcomes(failed=1)
    line = line_of(FAILS_IN_A_HELPER, "assert i != 1")
    result.stdout.fnmatch_lines([f"*test_instances.py:{line}: Failed: instance 1 of 3 raised AssertionError: "
                                 "instance 1 is wrong (pid * on localhost)"])
    result.stdout.no_fnmatch_line("*pytest_plugin.py*")


def test_tb_native_starts_at_the_test_function(pytester: pytest.Pytester) -> None:
    """Before, the native traceback started with the plugin's and pluggy's frames in the instance."""
    result = run(pytester, FAILS_IN_A_HELPER, "--tb=native")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "instance 1 of 3 raised AssertionError: instance 1 is wrong (pid * on localhost)",
        "Traceback (most recent call last):",
        f'  File "*test_instances.py", line {line_of(FAILS_IN_A_HELPER, "    check(i)")}, in test_body',
        "    check(i)",
        f'  File "*test_instances.py", line {line_of(FAILS_IN_A_HELPER, "assert i != 1")}, in check',
    ])
    result.stdout.no_fnmatch_line("*pytest_plugin.py*")
    result.stdout.no_fnmatch_line("*pluggy/*")


def test_a_hanging_instance_times_out_with_its_stack_in_the_report(pytester: pytest.Pytester) -> None:
    body = f"""
def wait_here():
    time.sleep({RUN_TIMEOUT})

@pytest.mark.poprun(num_instances=3, timeout=2)
def test_body():
    if popdist.getInstanceIndex() == 1:
        wait_here()
    C.barrier()
"""
    result = run(pytester, body)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "timed out after 2s; the stacks of the instances still running (0-2) follow",
        "instance 0 of 3 timed out (pid * on localhost)",
        "*File *, line * in barrier",
        "instance 1 of 3 timed out (pid * on localhost)",
        f'*File "*test_instances.py", line {line_of(body, "time.sleep")} in wait_here',
        f'*File "*test_instances.py", line {line_of(body, "    wait_here()")} in test_body',
        "instance 2 of 3 timed out (pid * on localhost)",
    ])


def test_skip_and_xfail_in_one_instance_become_the_tests_outcome(pytester: pytest.Pytester) -> None:
    body = """
@pytest.mark.poprun(num_instances=3)
def test_skipped():
    if popdist.getInstanceIndex() == 1:
        pytest.skip("not on this one")

@pytest.mark.poprun(num_instances=3)
def test_xfailed():
    if popdist.getInstanceIndex() == 2:
        pytest.xfail("known to break")

@pytest.mark.xfail(reason="marked", strict=True)
@pytest.mark.poprun(num_instances=2)
def test_marked_xfail():
    assert popdist.getInstanceIndex() == 0
"""
    result = run(pytester, body)
    result.assert_outcomes(skipped=1, xfailed=2)
    result.stdout.fnmatch_lines([
        f"SKIPPED [[]1[]] test_instances.py:{line_of(body, 'pytest.skip(')}: instance 1 of 3: not on this one",
        "XFAIL test_instances.py::test_xfailed - instance 2 of 3: known to break",
    ], consecutive=False)


def test_a_skip_does_not_hide_another_instances_failure(pytester: pytest.Pytester) -> None:
    """Instance 0 skips and has ended (its end of the FIFO closes with its process) before instance 1 fails.
    Before, the first instance to end decided: the test was skipped and instance 1's failure never shown."""
    result = run(pytester, """
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "instance0-ended"
    os.mkfifo(path)
    return path

@pytest.mark.poprun(num_instances=2, timeout=30)
def test_body(fifo):
    if popdist.getInstanceIndex() == 0:
        held = os.open(fifo, os.O_WRONLY)  # closed when this instance's process ends
        pytest.skip("not on instance 0")
    with open(fifo, "rb") as ended:
        assert ended.read() == b""
    assert False, "instance 1 is broken"
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "instance 1 of 2 raised AssertionError: instance 1 is broken*",
        "also: instance 0 of 2 skipped: not on instance 0 (pid * on localhost)",
        "FAILED test_instances.py::test_body - Failed: instance 1 of 2 raised*",
    ])


def test_collectives_inside_tests(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.poprun(num_instances=4)
def test_allreduce_broadcast_allgather():
    i = popdist.getInstanceIndex()
    assert C.allreduce(np.array([i + 1.0]), op="mean")[0] == 2.5
    assert C.broadcast(np.array([i]), root=3)[0] == 3
    assert C.allgather(np.array([i])).ravel().tolist() == [0, 1, 2, 3]

@pytest.mark.poprun(num_instances=2, num_replicas=4)
def test_replicas():
    from popdist import replicas
    sums = replicas.run(lambda r: r.cross_replica_sum(np.array([r.index])))
    assert [s[0] for s in sums] == [6, 6]
""")
    result.assert_outcomes(passed=2)


def test_under_xdist_every_test_gets_its_own_job(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.parametrize("n", range(8))
@pytest.mark.poprun(num_instances=3)
def test_body(n, tmp_path):
    i = popdist.getInstanceIndex()
    assert C.allreduce(np.array([n * (i + 1)]))[0] == 6 * n
    (tmp_path / "done").write_text("")
""", "-n", "2")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*2 workers*"])


def test_the_spawn_instances_fixture_drives_several_launches(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
from poprun_py import InstancesFailed

def test_launches(spawn_instances):
    assert spawn_instances(lambda: popdist.getInstanceIndex(), num_instances=2) == [0, 1]
    total = spawn_instances(lambda x: C.allreduce(np.array([x]))[0], 5, num_instances=3)
    assert total == [15, 15, 15]
    with pytest.raises(InstancesFailed, match="instance 1 of 2"):
        spawn_instances(lambda: 1 / (1 - popdist.getInstanceIndex()), num_instances=2)
    with pytest.raises(InstancesFailed, match="timed out after 1s"):
        spawn_instances(time.sleep, 60, num_instances=1, timeout=1)

def test_skip_from_a_launch(spawn_instances):
    spawn_instances(lambda: pytest.skip("inside"), num_instances=2)
""")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_instances.py:*: instance ? of 2: inside"])


@pytest.mark.parametrize("marker,words", [
    ("poprun(num_instance=2)", "unknown argument num_instance; it takes num_instances, num_replicas,"),
    ("poprun(num_instances=0)", "num_instances must be at least 1, got 0"),
    ("poprun(2)", "takes keyword arguments only"),
    ("poprun(num_instances=2, num_replicas=3)", "num_replicas=3 cannot be divided evenly among num_instances=2"),
    ("poprun(num_instances=2, num_replicas=2**21)",
     "num_replicas=2097152 x ipus_per_replica=1 is 2097152 IPUs; at most 1048576 can be asked for"),
    ("poprun(num_instances=2, offline=False, ipus_per_replica=3)",
     "with offline=False * power of two: num_replicas=2 x ipus_per_replica=3 is 6 IPUs; *or use offline=True"),
])
def test_bad_marker_arguments_are_one_line_errors(pytester: pytest.Pytester, marker: str, words: str) -> None:
    """Before any fixture is set up. Before, the IPU count and a partition size that is not a power of two
    were found when the test ran, after its fixtures: a 40-line traceback naming poprun's flags."""
    result = run(pytester, f"""
@pytest.fixture
def expensive():
    print("FIXTURE SET UP")

@pytest.mark.{marker}
def test_body(expensive):
    pass
""")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"@pytest.mark.poprun: {words}*", "*short test summary*"])
    result.stdout.no_fnmatch_line("*FIXTURE SET UP*")


@pytest.mark.parametrize("value,words", [
    ("nan", "must be from 0 to 1000000 seconds (0: no limit), got nan"),
    ("-5", "must be from 0 to 1000000 seconds (0: no limit), got -5"),
    ("inf", "must be from 0 to 1000000 seconds (0: no limit), got inf"),
    ("abc", "'abc' is not a number of seconds"),
])
def test_a_bad_poprun_timeout_is_one_usage_error_for_the_session(pytester: pytest.Pytester, value: str,
                                                                    words: str) -> None:
    """Before, nan and negative numbers silently meant no limit, inf was blamed on the marker, and abc was an
    error on every test."""
    pytester.makeini(f"[pytest]\npoprun_timeout = {value}\n")
    result = run(pytester, """
@pytest.mark.poprun(num_instances=1)
def test_body():
    pass

def test_other():
    pass
""")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: ini value poprun_timeout: {words}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
