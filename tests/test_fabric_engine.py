"""The fabric's collectives between real processes: results, determinism, mismatches, losses, intruders.

Each test runs a real RendezvousServer here and N worker processes
(programs/fabric_worker.py) that connect() and run a scenario; results come
back as .npz files and JSON lines. Every wait is bounded and every test ends
with no worker alive (and nothing in /dev/shm with the job's id). Host
labels make one machine several "hosts" (TCP between them). The last tests
drive the two ends of one same-host link (socket and mailboxes) in this process.
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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from support import PROGRAMS, program

sys.path.insert(0, str(PROGRAMS))
from fabric_cases import make_input, suite  # noqa: E402

from simipu.fabric import CollectiveMismatchError, PeerLostError  # noqa: E402
from simipu.fabric.algorithms.phases import Phase  # noqa: E402
from simipu.fabric.connect import Listeners, build_mesh, open_mailboxes  # noqa: E402
from simipu.fabric.engine import Fabric  # noqa: E402
from simipu.fabric.frames.exchange import exchange  # noqa: E402
from simipu.fabric.frames.header import ALLGATHER, NBYTES, Signature, encode_prefix, mismatch_notice  # noqa: E402
from simipu.fabric.frames.link import Link, Receive, Send  # noqa: E402
from simipu.fabric.frames.mailbox import MailboxSegment  # noqa: E402
from simipu.fabric.frames.mailbox import supported as mailboxes_supported
from simipu.fabric.frames.messages import NOTHING_WAITS, Kept, take_message  # noqa: E402
from simipu.fabric.frames.watch import LossWatch  # noqa: E402
from simipu.fabric.join.rendezvous import RendezvousServer, join  # noqa: E402

#: Upper bound for any one job in these tests.
JOB_TIMEOUT = 40.0
#: Upper bound for survivors to report a loss once it is detectable (generous: a loaded 2-core machine).
LOSS_BOUND = 10.0
#: How a same-host link travels here.
LOCAL = "unix+mailbox" if mailboxes_supported() else "unix"
#: Host layouts (each instance's host label) where allreduce goes hierarchical: 2 hosts x 2 instances,
#: 3 hosts of 1 + 2 + 1, and 2 hosts whose instances interleave.
LAYOUTS = [("a", "a", "b", "b"), ("a", "b", "b", "c"), ("a", "b", "a", "b")]


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
                 fabric_timeout: float = 10.0, hosts: tuple[str, ...] | None = None, bind: str = "127.0.0.1") -> None:
        """``bind``: the address the rendezvous and every worker's TCP listener bind (an IPv6 one too)."""
        self.n, self.out = n, out
        self.job_id = f"t{uuid.uuid4().hex[:12]}"
        self.token = os.urandom(32)
        self.server = RendezvousServer(n, self.token, bind_host=bind, heartbeat_timeout=heartbeat_timeout,
                                       checkin_timeout=30)
        self.server.start()
        self.deadline = time.monotonic() + JOB_TIMEOUT
        self.workers: list[Worker] = []
        for i in range(n) if spawn is None else spawn:
            env = dict(os.environ, FABRIC_ADDRESS=f"{self.server.address[0]}:{self.server.address[1]}", FABRIC_BIND=bind,
                       FABRIC_TOKEN=self.token.hex(), FABRIC_JOB=self.job_id, FABRIC_INSTANCE=str(i),
                       FABRIC_INSTANCES=str(n), FABRIC_TRANSPORT=transport, FABRIC_TIMEOUT=str(fabric_timeout),
                       FABRIC_HOST=hosts[i] if hosts else "")
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


def links_seen_by(i: int, n: int, transport: str, hosts: tuple[str, ...] | None = None) -> dict[str, str]:
    same = (lambda j: hosts[i] == hosts[j]) if hosts else (lambda j: True)
    return {str(j): LOCAL if transport != "tcp" and same(j) else "tcp" for j in range(n) if j != i}


@pytest.mark.parametrize("n,transport", [(1, "auto"), (2, "auto"), (2, "tcp"), (3, "tcp"), (4, "auto")])
def test_every_collective_matches_numpy(jobs: list[Job], tmp_path: Path, n: int, transport: str) -> None:
    job = run_job(jobs, tmp_path, n, "suite", transport=transport)
    lines = job.finish()
    assert all(lines[i] == [{"links": links_seen_by(i, n, transport)}, {"done": i}] for i in range(n)), lines
    for i in range(n):
        results = job.results(i)
        cases = [case for case in suite(n) if i in case.members(n)]
        assert sorted(results) == sorted(case.name for case in cases)
        for case in cases:
            assert_bit_identical(results[case.name], case.expect(i, n, None), f"instance {i}, {case.name}")


def test_every_collective_over_tcp_on_ipv6_loopback(jobs: list[Job], tmp_path: Path) -> None:
    """The rendezvous and each instance's TCP listener on ``::1``: IPv6 addresses bind and connect as IPv4 ones."""
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    job = run_job(jobs, tmp_path, 3, "suite", transport="tcp", bind="::1")
    lines = job.finish()
    assert all(lines[i] == [{"links": links_seen_by(i, 3, "tcp")}, {"done": i}] for i in range(3)), lines
    for i in range(3):
        results = job.results(i)
        for case in suite(3):
            if i in case.members(3):
                assert_bit_identical(results[case.name], case.expect(i, 3, None), f"instance {i}, {case.name}")


@pytest.mark.parametrize("hosts", LAYOUTS, ids="".join)
def test_hierarchical_results_match_numpy_and_repeat_bit_for_bit(jobs: list[Job], tmp_path: Path,
                                                                  hosts: tuple[str, ...]) -> None:
    """Other host labels: TCP between "hosts", each host reduces first, and the bits depend on the layout only."""
    first, second = (run_job(jobs, tmp_path, 4, "suite", hosts=hosts) for _ in range(2))
    lines, _ = first.finish(), second.finish()
    assert all(lines[i] == [{"links": links_seen_by(i, 4, "auto", hosts)}, {"done": i}] for i in range(4)), lines
    cases = {case.name: case for case in suite(4)}
    for i in range(4):
        results, again = first.results(i), second.results(i)
        for name, array in results.items():
            assert_bit_identical(array, cases[name].expect(i, 4, hosts), f"instance {i}, {name}")
            assert again[name].tobytes() == array.tobytes(), f"{name} differs between runs on instance {i}"
    # the hierarchical order is not the flat one, so matching it bit for bit shows the fabric used it
    name = "allreduce-sum-float32-4x3"
    assert cases[name].expect(0, 4, hosts).tobytes() != cases[name].expect(0, 4, None).tobytes()


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


@pytest.mark.parametrize("scenario,hosts", [("mismatch-last", None), ("mismatch", LAYOUTS[0]),
                                           ("mismatch-last", LAYOUTS[0]), ("mismatch-last", LAYOUTS[1])])
def test_a_mismatch_anywhere_raises_on_every_instance(jobs: list[Job], tmp_path: Path, scenario: str,
                                                       hosts: tuple[str, ...] | None) -> None:
    """Also where no pair compares every header (hierarchical): mismatch notices reach the others."""
    job = run_job(jobs, tmp_path, 4, scenario, hosts=hosts)
    lines = job.finish()
    for i in range(4):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
        assert "instance 3 called allreduce(sum) on float64[4, 3]" in lines[i][0]["message"] or scenario == "mismatch"


def test_mismatched_calls_raise_on_every_instance(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 3, "mismatch")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[0][0]["message"].startswith("instance 0 called allreduce(sum) on float32[4, 3] but instance ")
    assert "instance 1 called allreduce(sum) on float64[4, 3] but instance " in lines[1][0]["message"]
    assert lines[2][0]["message"].startswith("instance 2 called allreduce(sum) on float32[5, 3] but instance ")


def test_a_board_frame_meets_link_frames_as_a_mismatch(jobs: list[Job], tmp_path: Path) -> None:
    """A small allreduce (the board) against a large one and a broadcast (a non-root waits for the root's frame
    alone, ``board_copies.RootBroadcast``): all three raise, each naming instance 0's call (its own finding, or
    a notice from the instance that found it first)."""
    job = run_job(jobs, tmp_path, 3, "mismatch-paths")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
        assert "instance 0 called allreduce(sum) on float32[16]" in lines[i][0]["message"], lines


def test_small_copies_on_the_boards_that_differ_raise_everywhere(jobs: list[Job], tmp_path: Path) -> None:
    """Two allgathers of other shapes, an allreduce and broadcasts from two roots, each published on its
    board: all five raise."""
    job = run_job(jobs, tmp_path, 5, "mismatch-board")
    lines = job.finish()
    for i in range(5):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    for i, call in ((0, "allgather"), (2, "allreduce(sum)"), (4, "broadcast(root=1)")):
        # found by this instance, or passed on by the one that found it first: its notice may come before the
        # frame that shows this instance the mismatch (CI saw instance 3's reach instance 0 first)
        message = lines[i][0]["message"]
        assert message.startswith(f"instance {i} called {call} on float32[16] but instance ") \
            or message.endswith(")") and "(reported by instance " in message, message


@pytest.mark.parametrize("scenario,transport", [("loop", "auto"), ("loop", "tcp"), ("loop-gather", "auto"),
                                                  ("loop-broadcast", "auto")])
def test_a_killed_peer_is_named_by_every_survivor(jobs: list[Job], tmp_path: Path, scenario: str,
                                                  transport: str) -> None:
    """Mid-allreduce (4 MiB), or mid-allgather or mid-broadcast of 1 KiB arrays (on the boards, when there are
    mailboxes)."""
    job = run_job(jobs, tmp_path, 3, scenario, transport=transport)
    for worker in job.workers:
        assert job.workers[worker.instance].read_line(job.deadline) == {"ready": worker.instance,
                                                                       "pid": worker.proc.pid}
    os.kill(job.workers[1].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in (0, 2):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == PeerLostError.__name__ and lines[i][0]["instance"] == 1, lines
    assert job.workers[1].proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_messages_sent_before_anyone_receives_arrive_in_order(jobs: list[Job], tmp_path: Path,
                                                              transport: str) -> None:
    job = run_job(jobs, tmp_path, 3, "messages", transport=transport)
    lines = job.finish()
    assert all(lines[i] == [{"done": i}] for i in range(3)), lines
    for i in range(3):
        got = job.results(i)
        for peer in set(range(3)) - {i}:
            assert got[f"small{peer}"].tolist() == [peer, i]
            assert_bit_identical(got[f"large{peer}"], make_input(f"message{peer}to{i}", peer, "float32", (1 << 18,)),
                                 f"instance {i}'s message from {peer}")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_two_instances_that_each_send_more_than_the_link_holds_both_finish(jobs: list[Job], tmp_path: Path,
                                                                          transport: str) -> None:
    job = run_job(jobs, tmp_path, 2, "message-flood", transport=transport)
    lines = job.finish()
    for i in range(2):
        assert lines[i] == [{"flood": i, "small": True, "large": True}, {"done": i}], lines


def test_a_sender_waiting_for_room_hears_of_the_mismatch_its_message_caused(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 2, "blocked-send-mismatch")
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in range(2):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
        assert "instance 1 called send/recv of a message from instance 0 on float64[4] but instance 0 called " \
               "send/recv of a message from instance 0 on float64[4194304]" in lines[i][0]["message"]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_messages_sent_before_collectives_are_set_aside_for_the_receive_after(jobs: list[Job], tmp_path: Path,
                                                                           transport: str) -> None:
    """As MPI buffers them: the receiver's barrier and allreduce meet the messages first (a mismatch before)."""
    job = run_job(jobs, tmp_path, 2, "send-across-barrier", transport=transport)
    lines = job.finish()
    assert lines == {0: [{"done": 0}], 1: [{"received": True}, {"done": 1}]}, lines


def test_a_message_unlike_the_one_expected_raises_on_both_ends(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 2, "message-mismatch")
    lines = job.finish()
    for i in range(2):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert "instance 1 called send/recv of a message from instance 0 on int64[4] but instance 0 called send/recv " \
           "of a message from instance 0 on float32[4]" in lines[1][0]["message"]


def test_a_receiver_waiting_for_a_killed_sender_is_told(jobs: list[Job], tmp_path: Path) -> None:
    job = run_job(jobs, tmp_path, 2, "recv-from-lost")
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    os.kill(job.workers[0].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    assert len(lines[1]) == 1 and lines[1][0]["error"] == PeerLostError.__name__ and lines[1][0]["instance"] == 0
    assert job.workers[0].proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_wait_for_a_message_from_any_of_several_is_told_of_a_killed_one(jobs: list[Job], tmp_path: Path,
                                                                         transport: str) -> None:
    """``Fabric.message_waiting`` (mpi4py's ANY_SOURCE and ``test``): None while nothing has come; a wait on
    instances 0 and 2 raises PeerLostError when 0 is killed, though 2 lives (its wait on stdin ends after)."""
    job = run_job(jobs, tmp_path, 3, "any-from-lost", transport=transport)
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    assert job.workers[1].read_line(job.deadline) == {"looked": None}
    os.kill(job.workers[0].proc.pid, signal.SIGKILL)
    lines = job.finish([job.workers[1]], deadline=time.monotonic() + LOSS_BOUND)
    assert len(lines[1]) == 1 and lines[1][0]["error"] == PeerLostError.__name__ and lines[1][0]["instance"] == 0
    job.workers[2].proc.stdin.write(b"go\n")  # type: ignore[union-attr]
    job.workers[2].proc.stdin.flush()  # type: ignore[union-attr]
    job.finish([job.workers[2]])


def test_a_small_broadcast_root_runs_ahead_of_late_readers(jobs: list[Job], tmp_path: Path) -> None:
    """Among three members the small broadcast's root waits for no reader (``board_copies.RootBroadcast``):
    it finishes six broadcasts before the others call any; they then take all six, two from the mailboxes
    and the rest from the sockets, in order and exact."""
    job = run_job(jobs, tmp_path, 3, "bcast-ahead")
    for worker in job.workers[1:]:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    assert job.workers[0].read_line(job.deadline) == {"ahead": 6}  # (before any reader was let go)
    for worker in job.workers[1:]:
        worker.proc.stdin.write(b"go\n")
        worker.proc.stdin.flush()
    lines = job.finish()
    assert lines[0] == [{"done": 0}], lines
    for i in (1, 2):
        assert lines[i] == [{"checked": 6}, {"done": i}], lines


def test_a_reader_calling_something_else_than_a_small_broadcast_fails_every_member(jobs: list[Job],
                                                                                   tmp_path: Path) -> None:
    """The root and the other reader return from the broadcast (nobody waits for the odd one); its mismatch
    notice reaches them in the barrier: all three raise, none hangs."""
    job = run_job(jobs, tmp_path, 3, "bcast-mismatch")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[1][0]["message"].startswith("instance 1 called allreduce(sum) on float32[16] but instance 0 "
                                             "called broadcast(root=0)"), lines


def test_a_board_frame_of_a_later_call_with_the_same_signature_is_a_mismatch(jobs: list[Job],
                                                                              tmp_path: Path) -> None:
    """Instance 2 skips a small broadcast (a reader sends nothing in it), so its allreduce's board frame is the
    next one on its links to the others, with this allreduce's signature but the collective number before:
    no instance returns from the allreduce, and the others name the numbers."""
    job = run_job(jobs, tmp_path, 3, "skipped-bcast")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert any("as collective #2 of its group but instance 2 called allreduce(sum) on float32[16] as collective #1"
               in lines[i][0]["message"] for i in (0, 1)), lines


@pytest.mark.parametrize("victim", [0, 2])
def test_a_killed_root_or_reader_of_small_broadcasts_is_named_by_every_survivor(jobs: list[Job], tmp_path: Path,
                                                                                victim: int) -> None:
    """Four members in a loop of small broadcasts from root 0 (the root's frames to each reader, nothing
    back): the root killed (the readers wait on its socket) or a reader (the root's frames to it stay
    unread until its socket fails): every survivor raises PeerLostError naming it."""
    job = run_job(jobs, tmp_path, 4, "loop-broadcast")
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    os.kill(job.workers[victim].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in {0, 1, 2, 3} - {victim}:
        assert len(lines[i]) == 1 and lines[i][0]["error"] == PeerLostError.__name__, lines
        assert lines[i][0]["instance"] == victim, lines


@pytest.mark.parametrize("victim", [2, 3])
def test_a_peer_killed_on_another_host_is_named_by_every_survivor(jobs: list[Job], tmp_path: Path,
                                                                   victim: int) -> None:
    """Hosts a, a, b, b: killing host b's leader (2) or its other instance (3) mid-allreduce."""
    job = run_job(jobs, tmp_path, 4, "loop", hosts=LAYOUTS[0])
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    os.kill(job.workers[victim].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in {0, 1, 2, 3} - {victim}:
        assert lines[i][-1]["error"] == PeerLostError.__name__ and lines[i][-1]["instance"] == victim, lines


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
        mailboxes = open_mailboxes(membership, "auto")
        links = build_mesh(membership, listeners, control, job.token, timeout=10, mailboxes=mailboxes)
    finally:
        listeners.close()
    with Fabric(membership, links, control, on_close=control.close, mailboxes=mailboxes) as fabric:
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


@pytest.mark.parametrize("hosts", [None, LAYOUTS[0]], ids=["one-host", "aabb"])
def test_shared_segments_reused_back_to_back_keep_results_right(jobs: list[Job], tmp_path: Path,
                                                                hosts: tuple[str, ...] | None) -> None:
    job = run_job(jobs, tmp_path, 4, "churn", hosts=hosts)
    lines = job.finish()
    assert all(lines[i] == [{"done": i}] for i in range(4)), lines


def test_the_chunked_shared_memory_allreduce_runs_two_phases_and_drains_on_a_layout_change(
        jobs: list[Job], tmp_path: Path) -> None:
    """Chunked: SHARED_READY (its descriptor the first time), SHARED_REDUCED, and no third phase; a change of
    layout (to the whole one and back) drains first (algorithms/shared.py)."""
    job = run_job(jobs, tmp_path, 3, "shm-phases")
    lines = job.finish()
    ready, reduced, drain = Phase.SHARED_READY, Phase.SHARED_REDUCED, Phase.SHARED_DRAIN
    chunked = [ready, reduced]
    expected = [{"phases": p} for p in (chunked, chunked, chunked, [drain, ready], [drain, *chunked])]
    assert all(lines[i] == [*expected, {"done": i}] for i in range(3)), lines


def test_broadcasts_and_allgathers_through_shared_memory_back_to_back_stay_right(jobs: list[Job],
                                                                                 tmp_path: Path) -> None:
    """Every root, changing sizes and kinds, allreduces between: each result exact, and every call above
    64 KiB went through the shared arenas (algorithms/shared_copies.py), not the sockets."""
    job = run_job(jobs, tmp_path, 4, "copy-churn")
    lines = job.finish()
    sizes = [400_000, 400_000, 240_000, 28, 400_000, 250_000, 240_000, 240_000]  # bytes of each step's array
    large = sum(1 for step in range(48) if sizes[step % 8] * (4 if step % 3 == 2 else 1) > 64 * 1024)
    assert all(lines[i] == [{"done": i, "copies": large}] for i in range(4)), lines


def test_shared_memory_calls_take_turns_over_a_ring_of_slots_and_stay_right(jobs: list[Job], tmp_path: Path) -> None:
    """256 KiB broadcasts, allgathers and allreduces, each kind twice round its ring of slots
    (algorithms/shared.py's ``slots_for``: so that a slot written again has left the peers' caches), every
    call's values its own: each result exact, and the segments span the ring (before: two halves, 1 MiB)."""
    from simipu.fabric.algorithms.shared import RING_BYTES

    job = run_job(jobs, tmp_path, 3, "copy-ring")
    lines = job.finish()
    assert all(len(lines[i]) == 1 and lines[i][0]["done"] == i for i in range(3)), lines
    for i in range(3):
        segments = lines[i][0]["segments"]
        assert segments["reduce"] >= RING_BYTES, lines  # (every member writes its allreduce's slots)
        assert segments["copy"] >= RING_BYTES, lines  # (the allgather's, and the root's broadcast)


@pytest.mark.skipif(LOCAL != "unix+mailbox", reason="the boards' steady path needs shared-memory mailboxes (x86-64)")
def test_steady_shared_memory_calls_let_a_crowded_instance_move_every_few_calls(jobs: list[Job],
                                                                              tmp_path: Path) -> None:
    """Three instances on one CPU: 40 broadcasts of 256 KiB (the boards' steady path from the second) give
    each instance's spreader its turn (``board.SPREAD_SHARED``), which says where the instance is; before,
    the steady plans spread every 256 calls, and a bad placement lasted whole loops."""
    job = run_job(jobs, tmp_path, 3, "spread-shared")
    lines = job.finish()
    cpu = min(os.sched_getaffinity(0))
    assert all(lines[i] == [{"done": i, "cpu": cpu + 1}] for i in range(3)), lines


def test_shared_memory_broadcasts_and_allgathers_that_differ_raise_everywhere(jobs: list[Job],
                                                                             tmp_path: Path) -> None:
    """Broadcasts from two roots and an allgather, all through shared memory: each raises, none hangs."""
    job = run_job(jobs, tmp_path, 3, "mismatch-copies")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[0][0]["message"].startswith("instance 0 called broadcast(root=0) on float32[100000] but ")


def test_out_arrays_give_the_fresh_results_and_a_wrong_one_raises_without_a_hang(jobs: list[Job],
                                                                                  tmp_path: Path) -> None:
    """broadcast/allgather with ``out=`` (in place, into another array, a row of ``out`` as the input) equal
    the fresh-array form bit for bit, small and through shared memory; a wrong ``out`` raises ValueError on
    the instances that passed it, after a call the others finish normally (none waits forever)."""
    job = run_job(jobs, tmp_path, 3, "copies-out")
    lines = job.finish()
    for i in range(3):
        assert len(lines[i]) == 6 and lines[i][5] == {"done": i}, lines
        if LOCAL == "unix+mailbox":  # the small calls took the boards (algorithms/board_copies.py)
            small = [[root, [count]] for root in range(-1, 3) for count in (7, 1_000)]
            steady = [[root, [100_000]] for root in range(-1, 3)]  # (steady_calls.SteadyCall: the checks made once)
            assert lines[i][4] == {"board_plans": sorted([[-1, [3]], *small]), "steady": steady}, lines
        messages = [line["bad_out"] for line in lines[i][:4]]
        for count, message in zip((1_000, 100_000, 1_000, 100_000), messages):
            if i == 1 or message is not None:  # (only instance 1's out was wrong in the first two calls)
                assert message == (f"out is float32[3, {count + 1}] but the result is float32[3, {count}]; "
                                   "pass an array of the result's dtype and shape, or no out"), lines
        assert (messages[:2] == [None, None]) == (i != 1), lines


@pytest.mark.parametrize("n", [2, 4])
def test_allreduce_into_out_gives_the_fresh_result_and_a_wrong_one_raises_without_a_hang(jobs: list[Job],
                                                                                          tmp_path: Path,
                                                                                          n: int) -> None:
    """allreduce with ``out=`` (another array, called again with new values so that the second call takes the
    engine's unchecked hot path; in place) equals the fresh-array form bit for bit, for sum, mean and max, small
    and through shared memory, with one peer (its own call path) and three; a wrong ``out`` raises ValueError on
    the instance that passed it only, after a call the others finish, and the fabric stays usable."""
    job = run_job(jobs, tmp_path, n, "allreduce-out")
    lines = job.finish()
    for i in range(n):
        assert len(lines[i]) == 3 and lines[i][2] == {"done": i}, lines
        assert (lines[i][0]["bad_out"] is None) == (i != 1), lines
        if LOCAL == "unix+mailbox":  # the small ones took the boards and remembered their out, and the one-phase
            # shared-memory ones kept a steady_calls.SteadyCall that did (in place too, on ranks 0 and 1)
            assert lines[i][1]["checked"] == [[op, [count]] for op in ("max", "mean", "sum")
                                              for count in (7, 1_000, 40_000)]
    assert lines[1][0]["bad_out"] == ("out is float32[1001] but the result is float32[1000]; "
                                      "pass an array of the result's dtype and shape, or no out")


@pytest.mark.parametrize("n", [2, 3])
def test_broadcasts_and_allgathers_into_one_out_again_stay_right(jobs: list[Job], tmp_path: Path, n: int) -> None:
    """The boards' hot path for broadcast and allgather (the second call with the same arrays skips the checks
    and reuses ``out``'s row views): new values each time, every root, in place and into another array, equal
    to the fresh-array form bit for bit, with one peer and two."""
    job = run_job(jobs, tmp_path, n, "copies-again")
    lines = job.finish()
    assert all(lines[i] == [{"done": i}] for i in range(n)), lines


def test_a_broken_fabric_refuses_the_hot_path_too(jobs: list[Job], tmp_path: Path) -> None:
    """After a mismatch, the small allreduce whose plan the hot path would find raises at once on every
    instance (the plans go when the fabric breaks), rather than publishing into a broken fabric."""
    job = run_job(jobs, tmp_path, 2, "after-break")
    lines = job.finish()
    for i in range(2):
        assert lines[i] == [{"first": CollectiveMismatchError.__name__, "again": "FabricError"}, {"done": i}], lines


def let_the_others_follow_instance_0(job: Job) -> dict[int, list[dict]]:
    """Every instance is ready; instance 0 has entered its collective alone (nothing printed for 0.5 s); then the
    others are told to go; what each printed after."""
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid}
    first = job.workers[0]
    quiet, _, _ = select.select([first.proc.stdout], [], [], 0.5)  # instance 0 waits in the collective, alone
    assert not quiet and not first.buffer
    for worker in job.workers[1:]:
        worker.proc.stdin.write(b"go\n")
        worker.proc.stdin.flush()
    return job.finish()


def test_a_sleeping_waiter_is_woken_by_a_mailbox_frame(jobs: list[Job], tmp_path: Path) -> None:
    """Instance 0 waits long enough to sleep in poll; the frames that end its wait come by shared memory
    (the peers' board publications, which see its sleeping flag and send the wake-up byte)."""
    job = run_job(jobs, tmp_path, 3, "slow")
    lines = let_the_others_follow_instance_0(job)
    assert all(lines[i] == [{"done": i}] for i in range(3)), lines
    assert all(job.results(i)["total"].tolist() == [6] * 5 for i in range(3))


def test_an_instance_that_cannot_build_its_mesh_is_lost_at_once(jobs: list[Job], tmp_path: Path) -> None:
    """Instance 1 is this test: it checks in with data sockets that are already closed. Instance 0 cannot
    connect, names it, and leaves without a goodbye, so the rendezvous tells us at once (not at a timeout)."""
    job = run_job(jobs, tmp_path, 2, "barrier", spawn=(0,), fabric_timeout=JOB_TIMEOUT)
    listeners = Listeners.open(job.job_id, 1, "auto", "127.0.0.1")
    me = listeners.peer(1, "auto")
    listeners.close()
    membership, control = join(job.server.address, job.token, me, 2, job_id=job.job_id, timeout=20)
    try:
        readable, _, _ = select.select([control.wake_fd], [], [], LOSS_BOUND)
        assert readable and 0 in control.lost(), "instance 0 failed to connect but was not reported lost"
    finally:
        control.close()
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    assert lines[0][-1]["error"] == PeerLostError.__name__ and lines[0][-1]["instance"] == 1, lines


# -- one same-host link, both ends in this process -----------------------------------------

@pytest.fixture
def link_pair() -> Iterator[tuple[Link, MailboxSegment, Link, MailboxSegment]]:
    """Instance 0's and instance 1's ends of their link: a Unix socket pair and each one's mailbox segment."""
    if not mailboxes_supported():
        pytest.skip("shared-memory mailboxes are used on x86-64 Linux only")
    sock0, sock1 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    seg0, seg1 = MailboxSegment("test-0", (0, 1), 0), MailboxSegment("test-1", (0, 1), 1)
    link0, link1 = Link(1, sock0, seg0.attach(1, os.dup(seg1.fd))), Link(0, sock1, seg1.attach(0, os.dup(seg0.fd)))
    yield link0, seg0, link1, seg1
    for closable in (link0, link1, seg0, seg1):
        closable.close()


HEADER = encode_prefix(ALLGATHER, 0, 1, "<i4", (3,), -1, 1, 7)


def send_ints(link: Link, value: int) -> Send:
    send = Send(link, HEADER + NBYTES.pack(12), memoryview(np.full(3, value, np.int32)).cast("B"))
    assert send.step()
    return send


def receive_ints(link: Link) -> list[int]:
    out = np.zeros(3, np.int32)
    receive = Receive(link, HEADER, 12, memoryview(out).cast("B"))
    for _ in range(100):  # everything was sent before: a few nonblocking reads at most
        if receive.step():
            return out.tolist()
    raise AssertionError("the frame did not arrive")


def test_a_peers_segment_is_mapped_writable_yet_read_through_read_only_views(link_pair) -> None:
    """Our mapping of a peer's segment is read-write at the page level (a read-only one made every small exchange
    slower: the mailbox module's docstring), but each view of it that our end keeps is read-only, so no code of
    ours can write a peer's memory."""
    link0, _, _, seg1 = link_pair
    inode = str(os.fstat(seg1.fd).st_ino)  # (instance 1's segment: another test's may still be mapped)
    mappings = [fields[1] for fields in map(str.split, Path("/proc/self/maps").read_text().splitlines())
                if len(fields) > 5 and fields[4] == inode]
    assert sorted(mappings) == ["rw-s", "rw-s"]  # instance 1's own, and instance 0's of it
    box = link0.mailbox
    views = (box._in, box._in_words, box._peer_header, box._board, box._board_words)
    assert all(view.readonly for view in views)
    with pytest.raises(TypeError):
        box._board[0] = 1


def test_a_link_keeps_frame_order_across_mailbox_and_socket(link_pair) -> None:
    """Frames 0 and 1 fill the mailbox, 2 takes the socket, 3 the slot frame 0 freed: received 0, 1, 2, 3."""
    link0, _, link1, _ = link_pair
    sends = [send_ints(link0, 0), send_ints(link0, 1), send_ints(link0, 2)]
    assert receive_ints(link1) == [0] * 3
    sends.append(send_ints(link0, 3))
    assert [send.boxed for send in sends] == [True, True, False, True]
    assert [receive_ints(link1)[0] for _ in range(3)] == [1, 2, 3]


def test_a_sleeping_receiver_gets_a_wake_byte_that_is_then_skipped(link_pair) -> None:
    link0, _, link1, seg1 = link_pair
    send_ints(link0, 5)
    assert not select.select([link1.sock], [], [], 0)[0], "a wake byte for a receiver that was not asleep"
    seg1.set_sleeping(True)
    send_ints(link0, 6)
    assert select.select([link1.sock], [], [], 0)[0], "no wake byte for the sleeping receiver"
    seg1.set_sleeping(False)
    send_ints(link0, 7)  # the mailbox is full: this one takes the socket, after the wake byte
    assert [receive_ints(link1)[0] for _ in range(3)] == [5, 6, 7]
    assert link1.available() == 0


class _PeerWritesAfterFirstLook:
    """Our end's mailbox, whose peer writes a frame (``write()``) just after our first look finds it empty."""

    def __init__(self, mailbox: object, write) -> None:
        self._mailbox, self._write, self.looks = mailbox, write, 0

    def peek(self, index: int):
        frame = self._mailbox.peek(index)
        self.looks += 1
        if self.looks == 1:
            self._write()
        return frame

    def __getattr__(self, name: str):
        return getattr(self._mailbox, name)


def test_a_message_wait_looks_at_the_mailbox_again_after_reading_a_wake_byte(link_pair) -> None:
    """A point-to-point wait (mpi4py's recv) found the mailbox empty; the peer then wrote its message there,
    saw us asleep and sent a WAKE byte. An earlier wake byte was still staged: the wait read the new one without
    looking again, returned nothing, and slept in poll with nothing left to wake it (a ping-pong hung in about
    one run of three). Now it looks again and takes the message."""
    link0, _, link1, seg1 = link_pair
    link0.nudge()
    assert link1.fill() == 1, "an earlier wake byte, read with an earlier frame and still staged"
    seg1.set_sleeping(True)
    link1.mailbox = _PeerWritesAfterFirstLook(link1.mailbox, lambda: send_ints(link0, 9))
    kept: Kept = deque()
    assert take_message(link1, lambda theirs: True, kept, NOTHING_WAITS) is None, "the message was not taken"
    assert link1.mailbox.looks == 2
    assert [np.frombuffer(payload, np.int32).tolist() for _, payload in kept] == [[9, 9, 9]]


def test_mismatches_and_notices_arrive_through_the_mailbox(link_pair) -> None:
    link0, _, link1, _ = link_pair
    send_ints(link0, 1)
    theirs = encode_prefix(ALLGATHER, 0, 1, "<f4", (3,), -1, 1, 7)
    mine = Signature(ALLGATHER, 0, 1, "<f4", (3,), -1, 1, 7)
    with pytest.raises(CollectiveMismatchError, match=r"^instance 1 called allgather on float32\[3\] but "
                                                      r"instance 0 called allgather on int32\[3\]"):
        exchange(theirs, [], [(link1, memoryview(bytearray(12)))], LossWatch(None), me=1, members=(0, 1),
                 mine=lambda: mine, flush_timeout=1)
    link0.send_notice(mismatch_notice(CollectiveMismatchError("instance 0 called x but instance 2 called y")))
    link1.mailbox.consume()  # (the mismatched frame's slot)
    link1.took()
    with pytest.raises(CollectiveMismatchError, match=r"instance 2 called y \(reported by instance 0\)$"):
        receive_ints(link1)


def publish_ints(link: Link, segment: MailboxSegment, value: int) -> None:
    """Frame ``link.sent`` on the writer's board (the way ``exchange_all`` publishes)."""
    payload = memoryview(np.full(3, value, np.int32)).cast("B")
    segment.publish(HEADER + NBYTES.pack(12), payload, [link.mailbox], [link.claim()])


def test_a_link_keeps_frame_order_across_board_mailbox_and_socket(link_pair) -> None:
    """Board, mailbox, board, mailbox, then the socket (both mailbox slots unread), then the board again:
    received in link order, from whichever way each frame took."""
    link0, seg0, link1, _ = link_pair
    publish_ints(link0, seg0, 0)
    send_ints(link0, 1)
    publish_ints(link0, seg0, 2)
    send_ints(link0, 3)  # the mailbox's other slot
    assert link0.mailbox.try_send(link0.sent, HEADER, memoryview(b"")) is False, "both mailbox slots are unread"
    send_ints(link0, 4)  # so this frame takes the socket
    assert [receive_ints(link1)[0] for _ in range(5)] == [0, 1, 2, 3, 4]
    publish_ints(link0, seg0, 5)
    assert receive_ints(link1) == [5] * 3
    assert link1.available() == 0


@pytest.mark.parametrize("n", [2, 4])
def test_large_copies_read_in_place_match_the_tcp_path_bit_for_bit(jobs: list[Job], tmp_path: Path,
                                                                    n: int) -> None:
    """Broadcasts from every root and allgathers above the (lowered) threshold read the peers' arrays in place
    (algorithms/cross_memory.py), with shared-segment calls between; each result exact, and the digest of them
    all the same on every instance and as over TCP."""
    job, tcp = run_job(jobs, tmp_path, n, "cross-copies"), run_job(jobs, tmp_path, n, "cross-copies", transport="tcp")
    lines, over_tcp = job.finish(), tcp.finish()
    digests = {line[-1].get("digest") for line in [*lines.values(), *over_tcp.values()]}
    assert len(digests) == 1 and None not in digests, (lines, over_tcp)
    large = 3 * (2 * n + 2)  # three of the four steps' arrays are above 256 KiB: 2 broadcasts per root, 2 allgathers
    assert all(lines[i][-1]["cross"] is True and lines[i][-1]["calls"] == large for i in range(n)), lines
    assert all(over_tcp[i][-1]["calls"] == 0 for i in range(n)), over_tcp


def test_large_copies_fall_back_to_the_segments_where_reads_are_refused(jobs: list[Job], tmp_path: Path) -> None:
    """Instance 1 runs as another user without CAP_SYS_PTRACE, so the kernel refuses its reads of the others'
    memory: the group's probe says so, and every instance takes the shared segments, with the same results."""
    if os.geteuid() != 0:
        pytest.skip("needs root: one instance changes to user nobody so that its reads are refused")
    job, reference = run_job(jobs, tmp_path, 3, "cross-refused"), run_job(jobs, tmp_path, 3, "cross-copies")
    lines, allowed = job.finish(), reference.finish()
    for i in range(3):
        assert lines[i][-1]["cross"] is False and lines[i][-1]["calls"] == 0, lines
        assert lines[i][-1]["digest"] == allowed[i][-1]["digest"] and allowed[i][-1]["cross"] is True, (lines, allowed)


def test_large_copies_read_in_place_that_differ_raise_everywhere(jobs: list[Job], tmp_path: Path) -> None:
    """After one allgather read in place: broadcasts from two roots and an allgather; each raises, none hangs."""
    job = run_job(jobs, tmp_path, 3, "mismatch-cross")
    lines = job.finish()
    for i in range(3):
        assert lines[i][0] == {"cross": True, "calls": 1}, lines
        assert len(lines[i]) == 2 and lines[i][1]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[0][1]["message"].startswith("instance 0 called broadcast(root=0) on float32[100000] but ")


def test_a_peer_killed_while_arrays_are_read_in_place_is_named_by_every_survivor(jobs: list[Job],
                                                                                 tmp_path: Path) -> None:
    """Instance 1 (the broadcasts' root, whose memory the others read) is killed mid-loop."""
    job = run_job(jobs, tmp_path, 3, "loop-cross")
    for worker in job.workers:
        assert worker.read_line(job.deadline) == {"ready": worker.instance, "pid": worker.proc.pid, "cross": True,
                                                  "calls": 1}
    os.kill(job.workers[1].proc.pid, signal.SIGKILL)
    lines = job.finish(deadline=time.monotonic() + LOSS_BOUND)
    for i in (0, 2):
        assert len(lines[i]) == 1 and lines[i][0]["error"] == PeerLostError.__name__ and lines[i][0]["instance"] == 1, lines


def test_a_read_refused_after_the_probe_raises_on_every_instance_without_a_hang(jobs: list[Job],
                                                                                tmp_path: Path) -> None:
    """The probe said yes, then instance 1 became another user: its reads fail mid-call; it still says so in
    the last phase, so every instance raises the same FabricError and none waits for it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: one instance changes to user nobody so that its reads are refused")
    job = run_job(jobs, tmp_path, 3, "cross-revoked")
    lines = job.finish()
    for i in range(3):
        assert lines[i][0] == {"cross": True, "calls": 1}, lines
        assert len(lines[i]) == 2 and lines[i][1]["error"] == "FabricError", lines
        message = lines[i][1]["message"]
        if i == 1:
            assert message.startswith("reading instance ") and "Operation not permitted" in message, lines
        else:
            assert message == ("instance 1 could not read a peer's array in place (process_vm_readv); this fabric "
                               "is unusable now"), lines


def test_a_steady_copy_whose_peers_are_late_falls_back_and_stays_right(jobs: list[Job], tmp_path: Path) -> None:
    """A large allgather like the last one takes the boards (algorithms/shared_copies_board.py); instance 0
    enters it while the others wait for this test: its plan gives up waiting, receives the general way, and
    every result (then broadcasts on the same path) is exact."""
    job = run_job(jobs, tmp_path, 3, "copy-late")
    lines = let_the_others_follow_instance_0(job)
    assert [line[0]["done"] for line in lines.values()] == [0, 1, 2], lines
    assert lines[0][0]["fallbacks"] >= 1, lines


def test_a_call_unlike_the_steady_ones_raises_everywhere(jobs: list[Job], tmp_path: Path) -> None:
    """The peers' third allgather takes the boards' steady path (algorithms/shared_copies_board.py), instance
    0's another size: all three raise, none hangs."""
    job = run_job(jobs, tmp_path, 3, "mismatch-steady")
    lines = job.finish()
    for i in range(3):
        assert lines[i][0] == {"steady_plans": 1}, lines  # (the second call took the steady path)
        assert len(lines[i]) == 2 and lines[i][1]["error"] == CollectiveMismatchError.__name__, lines
    assert lines[0][1]["message"].startswith("instance 0 called allgather on float32[100001] but instance "), lines
