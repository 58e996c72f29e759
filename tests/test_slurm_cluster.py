"""The private Slurm cluster of tests/infra works, and Slurm behaves as poprun's Slurm launcher expects.

These pin down the srun flags poprun relies on: an agent step per node whose
stdin/stdout is a binary channel (``--overlap -u``), concurrent steps in one
allocation (``--overlap``), and what happens to a task when its srun dies.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import Iterator

import psutil
import pytest

from infra.slurm_cluster import SlurmCluster, unavailable_reason
from support import read_line

TIMEOUT = 60
#: A remote agent stand-in: announce the pid, then copy stdin to stdout, byte for byte, until EOF.
ECHO = ("import os\nos.write(1, b'%d\\n' % os.getpid())\n"
        "while chunk := os.read(0, 65536):\n    os.write(1, chunk)\n")
#: A task that ignores stdin: announce the pid, then idle.
IDLE = "import os, time\nos.write(1, b'%d\\n' % os.getpid())\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture
def cluster_env(cluster: SlurmCluster) -> Iterator[dict[str, str]]:
    """The environment for Slurm commands; after the test, every job must have ended."""
    yield cluster.command_env()
    cluster.wait_idle()


@pytest.fixture
def allocation(cluster: SlurmCluster) -> Iterator[dict[str, str]]:
    """A two-CPU allocation held without a shell: srun run with this environment creates steps in it."""
    env = cluster.command_env()
    done = subprocess.run(["salloc", "--no-shell", "-N1", "-n2", "-J", "poprun-test"],
                          capture_output=True, env=env, timeout=TIMEOUT, check=True)
    job_id = re.search(rb"Granted job allocation (\d+)", done.stderr).group(1).decode()
    yield {**env, "SLURM_JOB_ID": job_id}
    subprocess.run(["scancel", job_id], env=env, timeout=TIMEOUT, check=True)
    cluster.wait_idle()


def agent_step(cluster: SlurmCluster, program: str) -> list[str]:
    """One task on the node, overlapping other steps, with unbuffered stdout so partial lines flow."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={cluster.node_name}", "--overlap", "-u",
            sys.executable, "-c", program]


def read_exactly(stream, size: int, timeout: float = TIMEOUT) -> bytes:
    """``size`` bytes from a pipe, failing (TimeoutError) if they do not all arrive in time."""
    data, deadline = bytearray(), time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(stream.fileno(), selectors.EVENT_READ)
        while len(data) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise TimeoutError(f"got {len(data)} of {size} bytes")
            chunk = os.read(stream.fileno(), size - len(data))
            if not chunk:
                raise EOFError(f"got {len(data)} of {size} bytes")
            data += chunk
    return bytes(data)


def wait_gone(pid: int, timeout: float = TIMEOUT) -> None:
    """Wait (bounded) until a process that is not our child has exited."""
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass


def test_the_node_is_registered_and_idle(cluster: SlurmCluster) -> None:
    assert cluster.node_state() == "idle"
    assert cluster.cpus == os.cpu_count()


def test_srun_runs_a_task_on_the_node(cluster: SlurmCluster, cluster_env: dict[str, str]) -> None:
    done = subprocess.run(["srun", "-N1", "-n1", "hostname", "-s"], capture_output=True, env=cluster_env,
                          timeout=TIMEOUT)
    assert (done.returncode, done.stdout) == (0, f"{cluster.node_name}\n".encode()), done.stderr


def test_salloc_runs_a_command_in_an_allocation(cluster: SlurmCluster, cluster_env: dict[str, str]) -> None:
    done = subprocess.run(["salloc", "-N1", "-n2", "sh", "-c",
                           "echo $SLURM_JOB_ID $SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE"],
                          capture_output=True, env=cluster_env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    job_id, nodelist, tasks_per_node = done.stdout.decode().split()
    assert job_id.isdigit() and (nodelist, tasks_per_node) == (cluster.node_name, "2")


def test_an_agent_step_inside_salloc_is_a_byte_exact_pipe(cluster: SlurmCluster,
                                                          cluster_env: dict[str, str]) -> None:
    payload = os.urandom(300_000) + b"\x00" * 1000 + b"\xff\xfe\xc3(not utf-8)\r\n\x00no newline at the end"
    step = subprocess.run(["salloc", "-N1", "-n2", *agent_step(cluster, ECHO)], input=payload,
                          capture_output=True, env=cluster_env, timeout=TIMEOUT)
    # srun exiting 0 after we closed its stdin means the remote task saw EOF and ended.
    assert step.returncode == 0, step.stderr
    pid_line, echoed = step.stdout.split(b"\n", 1)
    assert pid_line.isdigit() and echoed == payload
    wait_gone(int(pid_line))


def test_an_agent_step_answers_partial_lines_before_stdin_closes(cluster: SlurmCluster,
                                                                 allocation: dict[str, str]) -> None:
    with subprocess.Popen(agent_step(cluster, ECHO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=allocation) as srun:
        pid = int(read_line(srun.stdout))
        for message in (b"\x00\xff request without newline", b"\n", bytes(range(256)) * 64):
            srun.stdin.write(message)
            srun.stdin.flush()
            assert read_exactly(srun.stdout, len(message)) == message
        srun.stdin.close()
        assert srun.wait(TIMEOUT) == 0
    wait_gone(pid)


def test_steps_with_overlap_run_at_once(cluster: SlurmCluster, allocation: dict[str, str], tmp_path) -> None:
    """Opening a FIFO blocks until both ends are open: the steps can only finish if they run together."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    step = ["srun", "-N1", "-n1", "--overlap", sys.executable, "-c"]
    writer = subprocess.Popen([*step, f"open({str(fifo)!r}, 'w').write('met')"], env=allocation)
    try:
        reader = subprocess.run([*step, f"print(open({str(fifo)!r}).read())"], capture_output=True,
                                env=allocation, timeout=TIMEOUT)
        assert (reader.returncode, reader.stdout) == (0, b"met\n"), reader.stderr
        assert writer.wait(TIMEOUT) == 0
    finally:
        writer.kill()
        writer.wait()


def test_sigkill_of_srun_kills_its_task(cluster: SlurmCluster, allocation: dict[str, str]) -> None:
    """srun forks a shepherd that cancels the step when srun dies, even by SIGKILL."""
    with subprocess.Popen(agent_step(cluster, IDLE), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          env=allocation) as srun:
        pid = int(read_line(srun.stdout))
        assert psutil.pid_exists(pid)
        srun.kill()
        srun.wait(TIMEOUT)
    wait_gone(pid)
    assert not psutil.pid_exists(pid)


def test_sigkill_of_srun_and_its_shepherd_leaves_the_task_until_the_step_is_cancelled(
        cluster: SlurmCluster, allocation: dict[str, str]) -> None:
    """With its whole process group killed, nothing cancels the step, and the task's stdin stays open."""
    with subprocess.Popen(agent_step(cluster, ECHO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=allocation, start_new_session=True) as srun:
        pid = int(read_line(srun.stdout))
        os.killpg(srun.pid, signal.SIGKILL)
        srun.wait(TIMEOUT)
    steps = subprocess.run(["squeue", "-h", "-s", "-j", allocation["SLURM_JOB_ID"], "-o", "%i"],
                           capture_output=True, env=allocation, timeout=TIMEOUT, check=True).stdout.split()
    assert psutil.pid_exists(pid) and len(steps) == 1, steps
    subprocess.run(["scancel", steps[0]], env=allocation, timeout=TIMEOUT, check=True)
    wait_gone(pid)
    assert not psutil.pid_exists(pid)
