"""Failure policy: first failure wins and is named; signals; no orphans, even after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from poprun_py.job import REPEAT_WINDOW_SECONDS
from support import RUN_TIMEOUT, Launch, assert_all_gone, pids_of, poprun_command, python_program, read_line, run_poprun

OFFLINE = "--offline-mode=1"

# mode -> (exit code, words the summary must contain)
MODES = {
    "exit3": (3, "exited with code 3"),
    "exception": (1, "exited with code 1"),
    "sysexit_msg": (1, "exited with code 1"),
    "keyboardinterrupt": (130, "SIGINT"),
    "sigkill": (137, "killed by SIGKILL (signal 9): killed, often by the out-of-memory killer"),
    "sigsegv": (139, "SIGSEGV (signal 11): a segmentation fault"),
}


@pytest.mark.parametrize("instances,failing", [(1, 0), (3, 1)])
@pytest.mark.parametrize("mode", MODES)
def test_exit_status_matrix(instances: int, failing: int, mode: str) -> None:
    code, words = MODES[mode]
    n = str(instances)
    result = run_poprun(OFFLINE, "--num-instances", n, "--num-replicas", n, "--stop-grace", "10",
                        *python_program("behave.py", "--fail", str(failing), mode, "--others", "sleep"))
    assert result.returncode == code, result.stderr
    errors = [line for line in result.stderr.decode().splitlines() if " POPRUN [E] " in line]
    assert errors and f"instance {failing} of {instances} (pid " in errors[0] and words in errors[0], errors
    if instances > 1:
        assert any("stopped by poprun as a consequence: 0, 2" in line for line in errors), errors


def test_summary_carries_the_stderr_tail() -> None:
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--only-output-from-instance", "0",
                        *python_program("behave.py", "--fail", "1", "exception", "--others", "sleep"))
    assert result.returncode == 1
    stderr = result.stderr.decode()
    # instance 1's output is hidden, but its failure and traceback are not
    assert "RuntimeError: instance 1 broke on purpose" in stderr
    assert "last lines of instance 1's stderr:" in stderr


def test_successful_instances_do_not_stop_the_others() -> None:
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                        *python_program("behave.py", "--others", "exit0"))
    assert result.returncode == 0 and result.stderr == b""


def test_sigint_stops_all_instances() -> None:
    launch = Launch(OFFLINE, "--num-instances", "3", "--num-replicas", "3",
                    *python_program("behave.py", "--ready", "--others", "sleep"))
    pids = pids_of(launch.wait_for_lines(b"ready", 3))
    launch.process.send_signal(signal.SIGINT)
    assert launch.finish() == 130
    assert b"received SIGINT" in launch.stderr
    assert_all_gone(pids)


def test_instances_ignoring_sigterm_get_sigkill_after_the_grace_period() -> None:
    launch = Launch(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "1",
                    *python_program("behave.py", "--ready", "--others", "ignore_term"))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 128 + signal.SIGTERM
    assert b"did not stop within 1s: sending SIGKILL" in launch.stderr
    assert_all_gone(pids)


def test_second_ctrl_c_kills_at_once() -> None:
    launch = Launch(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "600",
                    *python_program("behave.py", "--ready", "--others", "ignore_term"))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    launch.process.send_signal(signal.SIGINT)
    launch.wait_for_lines(b"instance", 2)  # both said they ignore SIGINT
    time.sleep(REPEAT_WINDOW_SECONDS)  # a second keypress, not the first one delivered twice
    launch.process.send_signal(signal.SIGINT)
    assert launch.finish(timeout=30) == 130  # far sooner than the 600 s grace
    assert b"killing the instances now" in launch.stderr
    assert_all_gone(pids)


def test_one_ctrl_c_delivered_twice_at_once_is_one_ctrl_c() -> None:
    """A terminal and a wrapper both pass on the same Ctrl-C: the second copy does not kill at once.

    Real signals: the second SIGINT is sent as soon as poprun says it handled the first
    (milliseconds, well inside the window); only a third, after the window, kills.
    """
    process = subprocess.Popen(
        poprun_command(OFFLINE, "-v", "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "600",
                       *python_program("behave.py", "--ready", "--others", "ignore_term")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pids = [int(read_line(process.stdout).split()[2]) for _ in range(2)]
        process.send_signal(signal.SIGINT)
        assert b"received SIGINT" in _stderr_line_with(process, (b"received SIGINT",))
        process.send_signal(signal.SIGINT)  # the same keypress, through a wrapper
        line = _stderr_line_with(process, (b"SIGINT again",))
        assert b"taken as the same one" in line, line  # before: "killing the instances now"
        assert all(psutil.pid_exists(pid) for pid in pids)
        time.sleep(REPEAT_WINDOW_SECONDS)  # now it is a second Ctrl-C
        process.send_signal(signal.SIGINT)
        assert b"killing the instances now" in _stderr_line_with(process, (b"killing the instances now",))
        assert process.wait(RUN_TIMEOUT) == 130
        assert_all_gone(pids)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(RUN_TIMEOUT)
        process.stdout.close()
        process.stderr.close()


def _stderr_line_with(process: subprocess.Popen, needles: tuple[bytes, ...]) -> bytes:
    """The next stderr line holding one of ``needles`` (bounded in time; b"" if stderr ends first)."""
    while True:
        line = read_line(process.stderr)
        if not line or any(needle in line for needle in needles):
            return line


def test_failure_stops_instances_that_ignore_sigterm(tmp_path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    launch = Launch(OFFLINE, "--num-instances", "3", "--num-replicas", "3", "--stop-grace", "1",
                    *python_program("behave.py", "--ready", "--fail", "2", "exit3", "--others", "ignore_term"),
                    env={**os.environ, "BEHAVE_GO_FIFO": str(fifo)})
    pids = pids_of(launch.wait_for_lines(b"ready", 3))
    os.close(os.open(fifo, os.O_WRONLY))  # every handler is in place: let instance 2 fail
    assert launch.finish() == 3
    stderr = launch.stderr.decode()
    assert "instance 2 of 3" in stderr and "exited with code 3" in stderr
    assert "sending SIGKILL" in stderr and "stopped by poprun as a consequence: 0, 1" in stderr
    assert_all_gone(pids)


def test_sigkill_of_poprun_leaves_no_instance_alive() -> None:
    launch = Launch(OFFLINE, "--num-instances", "3", "--num-replicas", "3",
                    *python_program("behave.py", "--ready", "--child", "--others", "sleep"))
    lines = launch.wait_for_lines(b"ready", 3)
    pids = pids_of(lines)
    launch.process.kill()
    launch.finish()
    assert_all_gone(pids)  # and the autouse leak check covers the grandchildren


def test_children_left_behind_are_killed_at_the_end() -> None:
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                        *python_program("behave.py", "--child", "--others", "exit0"))
    assert result.returncode == 0
    child_pids = [int(line.split()[2]) for line in result.stdout.splitlines() if line.startswith(b"child")]
    assert len(child_pids) == 2
    assert_all_gone(child_pids)


def test_a_time_limit_stops_every_instance_and_is_the_reported_cause() -> None:
    from poprun_py.events import EventQueue
    from poprun_py.executors.local import LocalExecutor
    from poprun_py.job import Job, TimeLimit
    from poprun_py.output import OutputOptions, OutputRouter
    from poprun_py.plan import LOCALHOST, InstancePlan
    from poprun_py.report import summary_lines

    events = EventQueue()
    plans = [InstancePlan(i, LOCALHOST, i, ("sleep", str(RUN_TIMEOUT)), {}, os.getcwd()) for i in range(2)]
    job = Job(LocalExecutor(events, dict(os.environ)), events, OutputRouter(OutputOptions(), 2), 2, grace=5,
              time_limit=TimeLimit(0.5))
    report = job.run(plans)
    assert report.timed_out == TimeLimit(0.5) and report.exit_code == 124 and report.first_failure is None
    assert report.signalled == {0, 1} and {f.signal for f in report.knock_ons} == {signal.SIGTERM}
    assert summary_lines(report) == ["timed out after 0.5s: poprun stopped the instances",
                                     "instances stopped by poprun as a consequence: 0, 1"]


def test_every_exit_category_has_its_own_code() -> None:
    from poprun_py.errors import exit_codes

    codes = exit_codes()
    assert {"EXIT_STARTUP_TIMEOUT", "EXIT_TIMEOUT", "EXIT_USAGE", "EXIT_INTERNAL"} <= set(codes)
    assert len(set(codes.values())) == len(codes), codes
