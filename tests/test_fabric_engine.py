"""The fabric's collectives between real processes: results, determinism, mismatches, losses, intruders.

Each test runs a real RendezvousServer here and N worker processes
(programs/fabric_worker.py) that connect() and run a scenario; results come
back as .npz files and JSON lines. Every wait is bounded and every test ends
with no worker alive (and nothing in /dev/shm with the job's id).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from support import PROGRAMS, program

sys.path.insert(0, str(PROGRAMS))
from fabric_cases import suite  # noqa: E402

from simipu.fabric import CollectiveMismatchError, PeerLostError  # noqa: E402
from simipu.fabric.connect import Listeners, build_mesh  # noqa: E402
from simipu.fabric.engine import Fabric  # noqa: E402
from simipu.fabric.rendezvous import RendezvousServer, join  # noqa: E402

#: Upper bound for any one job in these tests.
JOB_TIMEOUT = 40.0
#: Upper bound for survivors to report a loss once it is detectable (generous: a loaded 2-core machine).
LOSS_BOUND = 10.0


@dataclass
class Worker:
    instance: int
    proc: subprocess.Popen
    buffer: bytearray = field(default_factory=bytearray)
    stderr: bytes = b""

    def read_line(self, deadline: float) -> dict | None:
        """The next JSON line on its stdout, waiting until ``deadline``; None at EOF."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"instance {self.instance} printed nothing in time"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    return None
                self.buffer += data
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        return json.loads(line)


class Job:
    """A rendezvous here and N worker processes running one scenario; closing kills whatever is left."""

    def __init__(self, n: int, scenario: str, out: Path, *, transport: str = "auto",
                 heartbeat_timeout: float = 10.0, spawn: tuple[int, ...] | None = None,
                 fabric_timeout: float = 10.0) -> None:
        self.n, self.out = n, out
        self.job_id = f"t{uuid.uuid4().hex[:12]}"
        self.token = os.urandom(32)
        self.server = RendezvousServer(n, self.token, heartbeat_timeout=heartbeat_timeout, checkin_timeout=30)
        self.server.start()
        self.deadline = time.monotonic() + JOB_TIMEOUT
        self.workers: list[Worker] = []
        for i in range(n) if spawn is None else spawn:
            env = dict(os.environ, FABRIC_ADDRESS=f"{self.server.address[0]}:{self.server.address[1]}",
                       FABRIC_TOKEN=self.token.hex(), FABRIC_JOB=self.job_id, FABRIC_INSTANCE=str(i),
                       FABRIC_INSTANCES=str(n), FABRIC_TRANSPORT=transport, FABRIC_TIMEOUT=str(fabric_timeout))
            proc = subprocess.Popen([sys.executable, program("fabric_worker.py"), scenario, str(out)], env=env,
                                    stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.workers.append(Worker(i, proc))

    def finish(self, workers: list[Worker] | None = None, deadline: float | None = None) -> dict[int, list[dict]]:
        """Wait (until ``deadline``, at most the job's) for the workers to exit; every JSON line each printed."""
        lines: dict[int, list[dict]] = {}
        deadline = min(deadline or self.deadline, self.deadline)
        for worker in workers if workers is not None else self.workers:
            left = max(0.1, deadline - time.monotonic())
            try:
                stdout, worker.stderr = worker.proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                pytest.fail(f"instance {worker.instance} of job {self.job_id} did not finish in time")
            text = bytes(worker.buffer) + stdout
            lines[worker.instance] = [json.loads(line) for line in text.splitlines() if line.startswith(b"{")]
            if worker.proc.returncode not in (0, 3):  # a crash, not a reported error: show why
                lines[worker.instance].append({"crashed": worker.proc.returncode,
                                               "stderr": worker.stderr.decode(errors="replace")[-2000:]})
        return lines

    def results(self, instance: int) -> dict[str, np.ndarray]:
        with np.load(self.out / f"{instance}.npz") as data:
            return {name: data[name] for name in data.files}

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.communicate(timeout=10)
        self.server.close()
        leftovers = [name for name in os.listdir("/dev/shm") if self.job_id in name]
        assert not leftovers, f"shared memory left behind: {leftovers}"


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


def run_job(jobs: list[Job], tmp_path: Path, n: int, scenario: str, **options: object) -> Job:
    out = tmp_path / f"job{len(jobs)}"
    out.mkdir()
    job = Job(n, scenario, out, **options)  # type: ignore[arg-type]
    jobs.append(job)
    return job


def assert_bit_identical(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: values differ from the index-order reference"


@pytest.mark.parametrize("n,transport", [(1, "auto"), (2, "auto"), (2, "tcp"), (3, "tcp"), (4, "auto")])
def test_every_collective_matches_numpy(jobs: list[Job], tmp_path: Path, n: int, transport: str) -> None:
    job = run_job(jobs, tmp_path, n, "suite", transport=transport)
    lines = job.finish()
    assert all(lines[i] == [{"done": i}] for i in range(n)), lines
    for i in range(n):
        results = job.results(i)
        cases = [case for case in suite(n) if i in case.members(n)]
        assert sorted(results) == sorted(case.name for case in cases)
        for case in cases:
            assert_bit_identical(results[case.name], case.expect(i, n), f"instance {i}, {case.name}")


def test_results_are_bit_identical_across_runs_and_instances(jobs: list[Job], tmp_path: Path) -> None:
    first, second = (run_job(jobs, tmp_path, 4, "suite") for _ in range(2))
    first.finish(), second.finish()
    reference = first.results(0)
    for job in (first, second):
        for i in range(4):
            results = job.results(i)
            for name, array in results.items():
                if name.startswith(("allreduce", "broadcast", "allgather")) and "pair" not in name:
                    assert array.tobytes() == reference[name].tobytes(), f"{name} differs on instance {i}"


def test_mismatched_calls_raise_on_every_instance(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 3, "mismatch")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[0][0]["message"].startswith("instance 0 called allreduce(sum) on float32[4, 3] but instance ")
    assert "instance 1 called allreduce(sum) on float64[4, 3] but instance " in lines[1][0]["message"]
    assert lines[2][0]["message"].startswith("instance 2 called allreduce(sum) on float32[5, 3] but instance ")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_killed_peer_is_named_by_every_survivor(jobs: list[Job], tmp_path: Path, transport: str) -> None:
    job = run_job(jobs, tmp_path, 3, "loop", transport=transport)
    for worker in job.workers:
        assert job.workers[worker.instance].read_line(job.deadline) == {"ready": worker.instance,
                                                                       "pid": worker.proc.pid}
    os.kill(job.workers[1].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in (0, 2):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == PeerLostError.__name__ and lines[i][0]["instance"] == 1, lines
    assert job.workers[1].proc.returncode == -signal.SIGKILL


def test_a_stopped_host_is_declared_lost_by_heartbeat(jobs: list[Job], tmp_path: Path) -> None:
    """A peer whose socket stays open but who stops answering (as a lost host) is named via the rendezvous."""
    job = run_job(jobs, tmp_path, 3, "loop", transport="tcp", heartbeat_timeout=3.0)
    for worker in job.workers:
        assert worker.read_line(job.deadline) is not None
    victim = job.workers[2].proc
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        lines = job.finish(job.workers[:2], deadline=time.monotonic() + 3.0 + LOSS_BOUND)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        os.kill(victim.pid, signal.SIGCONT)
    for i in (0, 1):
        assert lines[i][-1]["error"] == PeerLostError.__name__ and lines[i][-1]["instance"] == 2, lines
        assert "no heartbeat" in lines[i][-1]["message"]


def test_a_group_runs_while_the_others_leave(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 4, "group")
    lines = job.finish()
    assert all(lines[i] == [{"done": i}] for i in range(4)), lines
    first, last = job.results(0), job.results(3)
    assert not (tmp_path / "job0" / "1.npz").exists()
    for name in first:
        assert first[name].tobytes() == last[name].tobytes()
    assert first["gather"].tolist() == [[0], [3]]


def test_a_connection_without_the_token_is_refused(jobs: list[Job], tmp_path: Path) -> None:
    """Instance 1 is this test: it probes instance 0's data sockets with wrong credentials, then joins properly."""
    job = run_job(jobs, tmp_path, 2, "barrier", spawn=(0,))
    listeners = Listeners.open(job.job_id, 1, "auto", "127.0.0.1")
    me = listeners.peer(1, "auto")
    membership, control = join(job.server.address, job.token, me, 2, job_id=job.job_id, timeout=20)
    try:
        peer0 = membership.peers[0]
        for family, address in ((socket.AF_INET, peer0.tcp_addr), (socket.AF_UNIX, "\0" + str(peer0.unix_name))):
            with socket.socket(family, socket.SOCK_STREAM) as intruder:
                intruder.settimeout(10)
                intruder.connect(address)
                intruder.sendall(b"PFH1" + bytes(56))  # the right shape, the wrong MAC
                assert intruder.recv(100) == b"", "a connection without the token was answered"
        links = build_mesh(membership, listeners, control, job.token, timeout=10)
    finally:
        listeners.close()
    with Fabric(membership, links, control, on_close=control.close) as fabric:
        fabric.barrier()  # the job goes on over the real connections
    lines = job.finish()
    assert lines[0] == [{"ready": 0, "pid": job.workers[0].proc.pid}, {"done": 0}]



def test_a_loss_outside_a_group_does_not_stop_it(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 3, "bystander")
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    job.workers[1].proc.kill()
    job.workers[1].proc.wait(timeout=10)
    for i in (0, 2):
        job.workers[i].proc.stdin.write(b"go\n")
        job.workers[i].proc.stdin.flush()
    lines = job.finish([job.workers[0], job.workers[2]], deadline=time.monotonic() + LOSS_BOUND)
    for i in (0, 2):  # the group's allreduces completed; the barrier with everyone names the dead one
        assert [job.results(i)[f"r{k}"].tolist() for k in range(3)] == [[2 * k + 2] * 4 for k in range(3)]
        assert lines[i][-1]["error"] == PeerLostError.__name__ and lines[i][-1]["instance"] == 1, lines


def test_a_late_peer_is_waited_for_and_a_lost_launcher_is_not(jobs: list[Job], tmp_path: Path) -> None:
    """Lateness is not an error (even 4x the fabric timeout); the rendezvous going away is, naming it (-1)."""
    job = run_job(jobs, tmp_path, 3, "late", fabric_timeout=0.25)
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    first = job.workers[0]
    quiet, _, _ = select.select([first.proc.stdout], [], [], 1.0)  # instance 0 waits in the barrier, alone
    assert not quiet and not first.buffer, "instance 0 said something while its peers were merely late"
    job.workers[1].proc.stdin.write(b"go\n")
    job.workers[1].proc.stdin.flush()
    job.server.close()  # instance 2 never comes, and now the launcher is gone
    lines = job.finish([first, job.workers[1]], deadline=time.monotonic() + LOSS_BOUND)
    for i in (0, 1):
        assert lines[i][-1]["error"] == PeerLostError.__name__ and lines[i][-1]["instance"] == -1, lines
