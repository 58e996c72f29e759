"""The fabric's set-up under conditions that once broke jobs: slow starters, many descriptors, squatters.

Each runs a real poprun job (tests/programs/fabric_harden.py) and checks it completes with the right
sums; see tests/test_rendezvous_hostile.py for hostile input to the rendezvous itself.
"""

from __future__ import annotations

import resource
import socket

import pytest

from support import Launch, python_program, read_line, run_poprun

OFFLINE = "--offline-mode=1"
JOB = (OFFLINE, "--num-instances", "2", "--num-replicas", "2")
#: The sum every instance prints: instance i contributes i + 1.
SUMS = [b"sum 3 3 3 3", b"sum 3 3 3 3"]


def sums(stdout: bytes) -> list[bytes]:
    return [line for line in stdout.splitlines() if line.startswith(b"sum ")]


def test_a_slow_starter_is_waited_for_up_to_the_start_up_timeout() -> None:
    """Instance 1 calls init() 3 s after instance 0, three times --fabric-timeout: start-up is bounded by
    --startup-timeout alone, so instance 0 (quiet while it waits) is not declared lost."""
    result = run_poprun(*JOB, "--fabric-timeout", "1", "--startup-timeout", "30",
                        *python_program("fabric_harden.py", "slow-start", "3"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert sums(result.stdout) == SUMS


def test_collectives_work_with_more_than_1024_descriptors_open() -> None:
    """select() cannot watch descriptors above 1024 (FD_SETSIZE); the fabric's waits must not use it."""
    count = 1100
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < count + 256:
        pytest.skip(f"the hard descriptor limit is below {count + 256}")
    result = run_poprun(*JOB, *python_program("fabric_harden.py", "many-fds", str(count)))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    highest = [int(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith(b"highest fd")]
    assert len(highest) == 2 and min(highest) > 1024, highest  # the fabric's sockets are above FD_SETSIZE
    assert sums(result.stdout) == SUMS


def test_a_squatter_on_the_old_predictable_socket_name_neither_breaks_nor_intercepts_the_job(tmp_path) -> None:
    """Another local user who read a job id (/proc/net/unix once listed ``poprun-<job>-<i>``) binds the name
    instance 1 would have used before it starts. The job runs as if it were not there, and nothing
    connects to the squatter."""
    go = tmp_path / "go"
    job = Launch(*JOB, *python_program("fabric_harden.py", "squatted", str(go)))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        try:
            line = read_line(job.process.stdout)
            assert line.startswith(b"job "), line
            squatter.bind(f"\0poprun-{line.split()[1].decode()}-1")
            squatter.listen(16)
            squatter.setblocking(False)
        finally:
            go.touch()  # instance 1 may go on (even if the squatter failed: the job must end)
        assert job.wait_for_lines(b"sum ", 2) == [line + b"\n" for line in SUMS]
        assert job.finish() == 0, job.stderr.decode()[-3000:]
        with pytest.raises(BlockingIOError):
            squatter.accept()  # no instance connected to it
