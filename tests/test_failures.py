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


def test_ctrl_c_while_poprun_imports_its_command_line_is_one_line_and_130(tmp_path) -> None:
    """A Ctrl-C in poprun's first ~0.1 s, before ``command.main``'s handler is in place: before, a traceback.

    A module named ``shutil`` first on PYTHONPATH (``poprun_py.command`` imports it, and nothing before it does)
    says that it is being imported, then waits for a signal: the SIGINT provably lands inside the import.
    """
    read_end, write_end = os.pipe()
    (tmp_path / "shutil.py").write_text(f"import os, signal\nos.write({write_end}, b'importing\\n')\n"
                                       "while True:\n    signal.pause()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    # (SIGINT at its default in poprun, as a terminal's foreground job has it: a background job of a
    # non-interactive shell, as CI may run the suite, inherits it ignored, and Python then leaves it so)
    process = subprocess.Popen(poprun_command(OFFLINE, "true"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, pass_fds=(write_end,),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as importing:
            assert read_line(importing) == b"importing\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (process.returncode, out, err) == (130, b"", b"poprun: interrupted\n")


def test_sigusr1_and_sigusr2_are_passed_on_and_the_job_goes_on() -> None:
    """As mpirun: a scheduler's "checkpoint now" (Slurm's --signal=USR1@120) reaches every instance, and the job
    goes on. Before, poprun died of SIGUSR1 (exit 138, no word) and the guardian killed its instances. SIGQUIT
    then stops the job as a stop signal, passed on (it was as silent)."""
    launch = Launch(OFFLINE, "-v", "--num-instances", "2", "--num-replicas", "2",
                    *python_program("behave.py", "--ready", "--others", "signals"))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        launch.process.send_signal(signum)
        got = sorted(launch.wait_for_lines(b"instance", 2))
        assert got == [f"instance {i} got {signum.name}\n".encode() for i in range(2)], got
    launch.process.send_signal(signal.SIGQUIT)
    assert sorted(launch.wait_for_lines(b"instance", 2)) == [b"instance 0 got SIGQUIT\n", b"instance 1 got SIGQUIT\n"]
    assert launch.finish() == 128 + signal.SIGQUIT, launch.stderr
    assert b"received SIGUSR1: passed on to instances 0, 1" in launch.stderr, launch.stderr
    assert b"received SIGUSR2: passed on to instances 0, 1" in launch.stderr, launch.stderr
    assert b"received SIGQUIT: stopping 2 instances" in launch.stderr, launch.stderr
    assert_all_gone(pids)


def test_instances_ignoring_sigterm_get_sigkill_after_the_grace_period() -> None:
    launch = Launch(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "1",
                    *python_program("behave.py", "--ready", "--others", "ignore_term"))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 128 + signal.SIGTERM
    assert b"instances 0, 1 did not stop within 1s: sending SIGKILL" in launch.stderr, launch.stderr
    assert_all_gone(pids)


def test_a_plain_kill_of_one_instance_is_said_in_the_singular_without_ctrl_c() -> None:
    """'stopping 1 instance', 'instance 0 did not stop', and no 'press Ctrl-C again' after a kill from a script
    (before: 'stopping 1 instances', 'instances 0', and a Ctrl-C nobody pressed)."""
    launch = Launch(OFFLINE, "--stop-grace", "1", *python_program("behave.py", "--ready", "--others", "ignore_term"))
    pids = pids_of(launch.wait_for_lines(b"ready", 1))
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 128 + signal.SIGTERM
    assert b"received SIGTERM: stopping 1 instance (SIGKILL in 1s; send SIGTERM again to kill at once)" \
        in launch.stderr, launch.stderr
    assert b"instance 0 did not stop within 1s: sending SIGKILL" in launch.stderr, launch.stderr
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


def test_an_instance_gone_from_the_fabric_is_named_first_though_its_peers_failures_are_reported_first(
        tmp_path) -> None:
    """The fabric saw instance 1's connection close (it died), and instances 0 and 2 fail of it (exit 3) before
    instance 1's own exit is reported (under load its kernel exit can take longer than their whole failure):
    instance 1 is the first failure, they are knock-ons. Before, the first exit reported won (a CI run at
    5a33d94 named instance 0 with code 3 where instance 1 had been SIGKILLed). Here instance 1 dies of its own
    SIGKILL once poprun's stop reaches it, after the others' failures: they fail only once its trap is in
    place, reading a line each that instance 1 writes into a FIFO after setting it (the CI of record once
    caught poprun's SIGTERM arriving before the trap under load, and instance 1 dying of poprun's own signal).
    Instance 1 opens the FIFO for reading and writing, which never blocks, and its writes fit the pipe: a
    blocking open would fail of the SIGTERM (EINTR, exit 2), as one per reader did under load."""
    from poprun_py.events import EventQueue, PeerGone
    from poprun_py.executors.local import LocalExecutor
    from poprun_py.job import Job
    from poprun_py.output import OutputOptions, OutputRouter
    from poprun_py.plan import LOCALHOST, InstancePlan

    events = EventQueue()
    events.put(PeerGone(1))  # (as the rendezvous puts it, before the failures it causes)
    os.mkfifo(tmp_path / "go")
    dies_when_stopped = ("sh", "-c", 'trap "kill -9 $$" TERM; exec 3<>go; echo >&3; echo >&3; sleep 60 & wait')
    fails = ("sh", "-c", "read line < go; exit 3")
    plans = [InstancePlan(i, LOCALHOST, i, dies_when_stopped if i == 1 else fails, {}, str(tmp_path))
             for i in range(3)]
    report = Job(LocalExecutor(events, dict(os.environ)), events, OutputRouter(OutputOptions(), 3), 3, grace=30).run(plans)
    assert report.first_failure is not None and report.first_failure.instance == 1, report
    assert report.first_failure.signal == signal.SIGKILL and report.exit_code == 137
    assert sorted(f.instance for f in report.knock_ons) == [0, 2]


def test_an_instance_that_left_the_fabric_but_died_of_poprun_s_stop_is_not_named_first() -> None:
    """The fabric saw instance 1's connection close as it was exiting of its own failure, and poprun's stop (for
    instance 0's failure) killed it before it could: instance 0's failure comes first (a fresh-clone CI at
    78e6ed2 named instance 1, 'terminated from outside poprun', exit 143)."""
    from poprun_py.events import EventQueue, PeerGone
    from poprun_py.executors.local import LocalExecutor
    from poprun_py.job import Job
    from poprun_py.output import OutputOptions, OutputRouter
    from poprun_py.plan import LOCALHOST, InstancePlan

    events = EventQueue()
    events.put(PeerGone(1))
    plans = [InstancePlan(0, LOCALHOST, 0, ("sh", "-c", "exit 3"), {}, os.getcwd()),
             InstancePlan(1, LOCALHOST, 1, ("sleep", str(RUN_TIMEOUT)), {}, os.getcwd())]
    report = Job(LocalExecutor(events, dict(os.environ)), events, OutputRouter(OutputOptions(), 2), 2, grace=30).run(plans)
    assert report.first_failure is not None and report.first_failure.instance == 0, report
    assert report.exit_code == 3 and [f.signal for f in report.knock_ons] == [signal.SIGTERM]


def test_every_exit_category_has_its_own_code() -> None:
    from poprun_py.errors import exit_codes

    codes = exit_codes()
    assert {"EXIT_STARTUP_TIMEOUT", "EXIT_TIMEOUT", "EXIT_USAGE", "EXIT_INTERNAL"} <= set(codes)
    assert len(set(codes.values())) == len(codes), codes


def run_with_instance_0_held_after_leaving(api: str, behaviour: str, tmp_path) -> tuple[int, str]:
    """poprun (3 instances) running ``hold_exit_after_leaving.py``: instance 0 is let go only once poprun has
    logged a peer's failure (of instance 0's loss); poprun's exit code and stderr."""
    import re
    import socket

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "release"))
        listener.listen(1)
        listener.settimeout(RUN_TIMEOUT)
        process = subprocess.Popen(
            poprun_command(OFFLINE, "-v", "--num-instances", "3", "--num-replicas", "3",
                           *python_program("hold_exit_after_leaving.py", api, behaviour)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "RELEASE_SOCKET": str(listener.getsockname())})
        try:
            held, _ = listener.accept()
            with held:
                held.settimeout(RUN_TIMEOUT)
                pid = int(held.recv(64).split()[0])
                seen = []
                while not re.search(rb" POPRUN \[I\] instance [12] failed", seen[-1] if seen else b""):
                    seen.append(read_line(process.stderr))
                    assert seen[-1], b"".join(seen).decode()
            _, rest = process.communicate(timeout=RUN_TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert_all_gone([pid])
    return process.returncode, (b"".join(seen) + rest).decode()


@pytest.mark.parametrize("api", ["mpi4py", "collectives"])
def test_an_instance_exiting_of_its_own_error_is_named_first_though_a_peer_s_failure_is_reported_first(
        api: str, tmp_path) -> None:
    """Instance 0 raises before the first collective; its fabric closes at exit, and instances 1 and 2 fail of
    its loss (PeerLostError) while its exit is still to come. Before, poprun named the first failure reaped
    (instance 1 or 2, only a PeerLostError in its tail) and SIGTERMed instance 0 as it was exiting, listing it as
    'stopped by poprun as a consequence' (2 runs in 3 of a tester's mpi4py program). Instance 0 holds its exit
    until poprun has logged a peer's failure, so the old order happens every time."""
    code, stderr = run_with_instance_0_held_after_leaving(api, "raise", tmp_path)
    errors = [line.split(" POPRUN [E] ", 1)[1] for line in stderr.splitlines() if " POPRUN [E] " in line]
    assert code == 1, stderr
    assert errors[0].startswith("instance 0 of 3 (pid ") and errors[0].endswith("exited with code 1"), stderr
    assert "  KeyError: 'the real bug is on instance 0'" in errors, stderr
    assert not [line for line in errors if "consequence" in line and "0" in line.split(":")[-1]], stderr


def test_an_instance_that_left_by_exiting_0_is_no_failure_its_waiting_peers_are(tmp_path) -> None:
    """Instance 0 exits 0 before the collective the others wait in: their PeerLostError is the first failure,
    and instance 0, which succeeded, is neither a failure nor stopped by poprun (before, poprun's stop reached
    it while it was exiting: 'stopped by poprun as a consequence: 0, 2')."""
    code, stderr = run_with_instance_0_held_after_leaving("mpi4py", "exit0", tmp_path)
    errors = [line.split(" POPRUN [E] ", 1)[1] for line in stderr.splitlines() if " POPRUN [E] " in line]
    assert code == 1, stderr
    assert errors[0].startswith(("instance 1 of 3", "instance 2 of 3")) and "exited with code 1" in errors[0], stderr
    assert any("PeerLostError: instance 0 is gone: its program ended" in line for line in errors), stderr
    summary = [line for line in errors if not line.startswith(" ")]  # (not the stderr tail's)
    assert not [line for line in summary if "instance 0 " in line or ("consequence" in line and "0" in line)], stderr
