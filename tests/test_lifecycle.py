"""Process lifecycle: no stranger is ever signalled, nothing of a job outlives it, start-up obeys signals and limits.

Real processes throughout: poprun as users run it, ``/bin/sleep`` as the
cheap instance, PID reuse forced through ``/proc/sys/kernel/ns_last_pid``.
The tests marked ``many_processes`` start hundreds of processes; each is
bounded (well under 30 s on an idle two-core machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator

import psutil
import pytest

from conftest import MARKER, marked_processes
from support import RUN_TIMEOUT, Launch, assert_all_gone, poprun_command, program, python_program, read_line, run_poprun

OFFLINE = "--offline-mode=1"
SLEEP = ("/bin/sleep", "1000")
PR_SET_CHILD_SUBREAPER = 36
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"

many_processes = pytest.mark.many_processes


def wait_until(condition: Callable[[], bool], what: str, timeout: float = RUN_TIMEOUT) -> None:
    """Poll ``condition`` (processes appear and vanish with no event to wait on), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def instances(n: int, *argv: str) -> list[str]:
    return [OFFLINE, "--num-instances", str(n), "--num-replicas", str(n), *argv]


def children(pid: int) -> list[int]:
    """The children of ``pid``, from its threads' lists (cheap: no scan of every process)."""
    found = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError), open(path) as listed:
            found.extend(int(child) for child in listed.read().split())
    return found


def guardians_of(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        with contextlib.suppress(psutil.Error):
            if any("guardian_process.py" in part for part in psutil.Process(child).cmdline()):
                found.append(child)
    return found


def is_zombie_or_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_nothing_marked_survives(marker: str, name: str | None = None) -> None:
    """No live process carries the test's marker (only those called ``name``, if given: a faster scan)."""
    if name is None:
        suspects = marked_processes(marker)
    else:
        suspects = []
        for proc in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["name"] == name and proc.environ().get(MARKER) == marker:
                    suspects.append(proc)
    def running() -> list[psutil.Process]:
        return [p for p in suspects if not is_zombie_or_gone(p.pid)]  # init reaps in its own time

    with contextlib.suppress(AssertionError):
        # the guardian's stop: a wait for pending forks, SIGTERM, --stop-grace (5 s), freeze, SIGKILL, then
        # a sweep for late execs; its scans read every process on the host, slow when a neighbouring test
        # runs 1,100 instances on a loaded machine
        wait_until(lambda: not running(), "the job's processes are gone", timeout=45)
    assert not running(), [(p.pid, p.cmdline()) for p in running()]


# -- 1. never a stranger ------------------------------------------------------------------------
def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("forcing a PID's reuse writes /proc/sys/kernel/ns_last_pid, which needs root")


def spawn_on_pid(pid: int, attempts: int = 20) -> subprocess.Popen:
    """A stranger, ``sleep`` leading a session and group of its own, on ``pid`` if the kernel lets it.

    ``ns_last_pid`` makes the next fork take ``pid`` when that number is free;
    another process on the host may fork in between, so a few attempts. The
    last stranger is returned even when it did not get ``pid``.
    """
    for _ in range(attempts):
        with open(NS_LAST_PID, "w") as last:
            last.write(str(pid - 1))
        stranger = subprocess.Popen(SLEEP, start_new_session=True)
        if stranger.pid == pid:
            return stranger
        stranger.kill()
        stranger.wait()
    return subprocess.Popen(SLEEP, start_new_session=True)


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This test process adopts orphans meanwhile, so it can reap one at a moment of its choosing."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


FIRST_EXITS = ('if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then echo "first $$"; else echo "second $$"; '
               'cat "$GO"; fi')


def test_a_stranger_on_an_exited_instances_pid_survives_the_end_of_the_job(tmp_path) -> None:
    """Instance 0 exits at once; a stranger that takes its PID must survive the job's end.

    Before the fix the launcher reaped instance 0 at once and, at the end,
    SIGKILLed group ``pid`` anyway: the stranger leading a group on that PID died.
    Now instance 0 stays an unreaped zombie until its group's last signal, so its
    PID cannot even be taken while the job runs.
    """
    _need_root()
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    launch = Launch(*instances(2, "sh", "-c", FIRST_EXITS), env={**os.environ, "GO": str(fifo)})
    lines = sorted(read_line(launch.process.stdout).split() for _ in range(2))
    first = int(lines[0][1])
    wait_until(lambda: is_zombie_or_gone(first), "instance 0 has exited")
    stranger = spawn_on_pid(first)
    try:
        assert stranger.pid != first, "instance 0's PID was free while the job ran"
        os.close(os.open(fifo, os.O_WRONLY))  # instance 1 may end: the job ends
        assert launch.finish() == 0, launch.stderr
        assert stranger.poll() is None, "the stranger was killed"
    finally:
        stranger.kill()
        stranger.wait()


def test_the_guardian_never_signals_a_stranger_on_a_reused_pid() -> None:
    """poprun dies; instance 0 (exited before) is reaped and its PID taken by a stranger; the guardian acts.

    The guardian is held stopped until the stranger exists, so it acts on a
    reused PID for sure. Before the fix it sent SIGTERM to every group it had
    been told of, the stranger's included. This test process is a subreaper
    meanwhile, so poprun's orphans come to it and it reaps instance 0 itself.
    """
    _need_root()
    with subreaper():
        # stderr not piped: the stopped guardian holds poprun's stderr open
        launch = subprocess.Popen(poprun_command(*instances(2, "sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; '
                                                            'then echo "first $$"; else echo "second $$"; '
                                                            'exec /bin/sleep 1000; fi')),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        lines = sorted(read_line(launch.stdout).split() for _ in range(2))
        first, second = int(lines[0][1]), int(lines[1][1])
        wait_until(lambda: is_zombie_or_gone(first), "instance 0 has exited")
        [guardian] = guardians_of(launch.pid)
        os.kill(guardian, signal.SIGSTOP)  # ours: a child of poprun, which is ours, and alive
        launch.kill()
        launch.wait(RUN_TIMEOUT)
        launch.stdout.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(first, 0)  # adopted by us when poprun died (the old poprun had reaped it)
        stranger = spawn_on_pid(first)
        try:
            os.kill(guardian, signal.SIGCONT)
            wait_until(lambda: is_zombie_or_gone(guardian), "the guardian has done its work")
            assert is_zombie_or_gone(second), "instance 1 survived"
            assert stranger.poll() is None, "the guardian killed a stranger"
            for adopted in (guardian, second):  # they came to us when poprun died
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(adopted, os.WNOHANG)
        finally:
            stranger.kill()
            stranger.wait()


# -- 3. no orphans ---------------------------------------------------------------------------------
@many_processes
def test_sigkill_of_poprun_during_start_up_leaves_nothing(no_leaked_processes: str) -> None:
    """30 trials: poprun is SIGKILLed after a different number of its 64 instances have started.

    The orphan of the old launcher was an instance spawned but not yet handed
    to the guardian when poprun died (a window of microseconds after each
    spawn), so what matters is many kills at points spread over the start-up,
    not the size: each trial kills after ``2 * trial + 1`` instances exist, so
    the 30 trials cover the start-up from its first spawn to its last. Before
    the fix, 11 of 30 such trials left an orphan.
    """
    for trial in range(30):
        launch = subprocess.Popen(poprun_command(*instances(64, *SLEEP)), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        started = 2 * trial + 1
        wait_until(lambda launch=launch, started=started: len(children(launch.pid)) > started
                   or launch.poll() is not None,
                   f"{started} instances have started")
        launch.kill()
        launch.wait(RUN_TIMEOUT)
        assert_nothing_marked_survives(no_leaked_processes, "sleep")


@many_processes
def test_1100_instances_die_with_poprun_by_the_guardian(no_leaked_processes: str) -> None:
    """More instances than ``select()`` can watch (1,024): the old guardian crashed and left them all."""
    launch = subprocess.Popen(poprun_command(*instances(1100, *SLEEP)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len(children(launch.pid)) > 1100 or launch.poll() is not None, "1100 instances run")
        assert launch.poll() is None, launch.stderr.read() if launch.stderr else ""
        pids = children(launch.pid)
    finally:
        launch.kill()
        launch.wait(RUN_TIMEOUT)
        launch.stderr.close()
    assert_all_gone(pids)
    assert_nothing_marked_survives(no_leaked_processes)


def test_killing_the_guardian_then_poprun_leaves_nothing(no_leaked_processes: str) -> None:
    """poprun starts another guardian when its guardian dies, so its own death next still stops the job."""
    launch = Launch(*instances(3, "sh", "-c", 'echo "ready $$"; exec /bin/sleep 1000'))
    pids = [int(line.split()[1]) for line in launch.wait_for_lines(b"ready", 3)]
    [guardian] = guardians_of(launch.process.pid)
    os.kill(guardian, signal.SIGKILL)  # poprun's child, alive: the pid is its own
    wait_until(lambda: guardians_of(launch.process.pid) not in ([], [guardian]), "poprun has a new guardian")
    launch.process.kill()
    launch.finish()
    assert b"the guardian (pid" in launch.stderr
    assert_all_gone(pids)
    assert_nothing_marked_survives(no_leaked_processes)


def _daemon_pids(stdout: bytes) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith(b"daemon ")]


def test_a_daemon_an_instance_starts_dies_with_the_job() -> None:
    """fork, setsid, fork, and an empty environment: out of every group, session and marker of the job.

    poprun adopts it (a child subreaper) and kills it at the end. Before, it
    outlived the job (as with mpirun).
    """
    result = run_poprun(*instances(2, sys.executable, program("daemonize.py"), "--clean-env"))
    daemons = _daemon_pids(result.stdout)
    try:
        assert result.returncode == 0, result.stderr
        assert len(daemons) == 2
        assert_all_gone(daemons)
    finally:
        for pid in daemons:  # they carry no marker the leak check could find
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_a_daemon_dies_with_poprun_by_the_guardian(no_leaked_processes: str) -> None:
    """poprun is SIGKILLed: the guardian finds the daemon by its token in the environment it inherited."""
    launch = Launch(*instances(2, sys.executable, program("daemonize.py"), "--stay"))
    lines = launch.wait_for_lines(b"", 4)
    daemons = _daemon_pids(b"".join(lines))
    assert len(daemons) == 2
    launch.process.kill()
    launch.finish()
    assert_all_gone(daemons)
    assert_nothing_marked_survives(no_leaked_processes)


# -- 4. start-up obeys signals and limits -------------------------------------------------------------
@many_processes
def test_ctrl_c_during_the_start_of_1000_instances_stops_it(no_leaked_processes: str, tmp_path) -> None:
    """SIGINT once a few instances run: poprun stops spawning, stops those, exits 130.

    Before, it went on until all 1,000 had started. Counted from the log
    (``--vv``: one "Started instance" line per spawn), never from the clock.
    """
    log = tmp_path / "poprun.log"  # a file, not a pipe: nothing reads it until poprun ends
    with open(log, "wb") as stderr:
        launch = subprocess.Popen(poprun_command("--vv", *instances(1000, *SLEEP)), stdout=subprocess.DEVNULL,
                                  stderr=stderr)
    try:
        wait_until(lambda: len(children(launch.pid)) > 10 or launch.poll() is not None, "10 instances run")
        launch.send_signal(signal.SIGINT)
        code = launch.wait(RUN_TIMEOUT)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    text = log.read_text()
    started = [line for line in text.splitlines() if "Started instance" in line]
    assert code == 130, text[-2000:]
    assert 10 <= len(started) < 1000, len(started)
    assert "received SIGINT while starting instances" in text
    assert_nothing_marked_survives(no_leaked_processes)


def _limit_open_files(limit: int, hard: int | None = None) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard or resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return apply


def test_a_launch_that_cannot_fit_the_open_file_limit_is_refused_up_front() -> None:
    """100 instances under a limit of 128 open files: one line naming the limit and how to raise it, exit 2.

    Before, poprun started instances until ``EMFILE`` and then failed with an internal error (70).
    """
    result = subprocess.run(poprun_command(*instances(100, "echo", "started")), capture_output=True,
                            timeout=RUN_TIMEOUT, preexec_fn=_limit_open_files(128))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2, result.stderr
    assert result.stdout == b""  # nothing started
    assert len(lines) == 1 and lines[0].startswith("poprun: error: "), lines
    assert "limit of 128" in lines[0] and "RLIMIT_NOFILE" in lines[0] and "ulimit -n" in lines[0]


def test_past_the_hard_open_file_limit_the_refusal_says_ulimit_cannot_help() -> None:
    result = subprocess.run(poprun_command(*instances(100, "echo", "started")), capture_output=True,
                            timeout=RUN_TIMEOUT, preexec_fn=_limit_open_files(128, 128))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines
    assert "only up to the hard limit of 128" in lines[0] and "run fewer instances per host" in lines[0]


def test_a_launch_that_fits_the_open_file_limit_runs() -> None:
    result = subprocess.run(poprun_command(*instances(4, "echo", "started")), capture_output=True,
                            timeout=RUN_TIMEOUT, preexec_fn=_limit_open_files(128))
    assert (result.returncode, result.stdout) == (0, b"started\n" * 4), result.stderr


def _start_a_daemon() -> int:
    result = subprocess.run([sys.executable, program("daemonize.py")], capture_output=True, check=True, timeout=30)
    return _daemon_pids(result.stdout)[0]


def test_a_daemon_a_function_instance_starts_dies_with_the_launch() -> None:
    """``poprun_py.launch`` runs in the caller's process, no subreaper: the guardian's token finds the daemon."""
    from poprun_py import launch

    daemons = launch(_start_a_daemon, num_instances=2)
    try:
        assert_all_gone(daemons)
    finally:
        for pid in daemons:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_function_instances_die_with_their_caller_even_without_the_guardian() -> None:
    """A forked instance dies with the process that forked it (``PR_SET_PDEATHSIG``), guardian or not.

    That closes the window between a fork and the guardian receiving its pidfd,
    where a forked instance (no token in the environment the kernel shows) could
    not be found. Here the guardian is held stopped, so only the kernel can stop
    the instances; before, they ran until the guardian was let go.
    """
    caller = subprocess.Popen(python_program("launch_and_wait.py", "3"), stdout=subprocess.PIPE)
    guardian = None
    try:
        pids = [int(read_line(caller.stdout).split()[2]) for _ in range(3)]
        [guardian] = guardians_of(caller.pid)
        os.kill(guardian, signal.SIGSTOP)  # the caller's child, alive: the pid is its own
        caller.kill()
        caller.wait(RUN_TIMEOUT)
        wait_until(lambda: all(is_zombie_or_gone(pid) for pid in pids), "the instances died", timeout=15)
    finally:
        if guardian is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(guardian, signal.SIGCONT)  # it finds nothing left, and exits
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        caller.stdout.close()
