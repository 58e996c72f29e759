"""Spreading a host's instances over its CPUs when it runs more instances than CPUs (simipu/fabric/algorithms/placement.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from simipu.fabric.algorithms.placement import CPU, Spreader, _current_cpu, crowded_move
from simipu.fabric.algorithms.waits import alone_waiter
from support import assert_all_gone, python_program, run_poprun


@pytest.mark.parametrize("cpu, mask, position, peers, expected", [
    # three on CPU 0 (we are the last), none on 1: we move to 1
    (0, {0, 1}, 2, [(0, 0), (1, 0), (3, 1)], 1),
    (0, {0, 1}, 2, [(0, 0), (1, 0)], 1),
    # a peer after us on our CPU is the one to move
    (0, {0, 1}, 1, [(0, 0), (2, 0), (3, 1)], None),
    # two and two: nothing to do
    (0, {0, 1}, 1, [(0, 0), (2, 1), (3, 1)], None),
    # peers not known yet (-1) or on CPUs outside our mask do not count
    (0, {0, 1}, 2, [(0, -1), (1, -1), (3, 5)], None),
    (0, {0, 1}, 2, [(0, -1), (1, 0), (3, 5)], 1),
    (2, {2, 3}, 3, [(0, 0), (1, 0), (2, 2), (4, 2)], None),
    (2, {2, 3}, 4, [(0, 0), (1, 0), (2, 2), (3, 2)], 3),
    # of equally quiet CPUs, the lowest
    (1, {0, 1, 2}, 2, [(0, 1), (1, 1)], 0),
    # not on a CPU of our mask (it changed): stay
    (4, {0, 1}, 2, [(0, 4), (1, 4)], None),
])
def test_only_the_last_instance_on_a_crowded_cpu_moves_to_the_quietest(cpu, mask, position, peers, expected) -> None:
    assert crowded_move(cpu, mask, position, peers) == expected


def _header() -> memoryview:
    return memoryview(bytearray(128)).cast("Q")


def test_spreading_moves_the_calling_thread_and_gives_back_its_mask() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to move between")
    here, there = cpus[0], cpus[1]
    mine, peers = _header(), [_header(), _header()]
    outcome: dict[str, object] = {}

    def crowded_then_spread() -> None:  # in its own thread: affinity is per thread
        spreader = Spreader(mine, 2, [(0, peers[0]), (1, peers[1])])
        for _ in range(5):  # (the kernel may move the thread around our pin and spread(): then again)
            os.sched_setaffinity(0, {here})
            os.sched_setaffinity(0, {here, there})
            for peer in peers:
                peer[CPU] = here + 1  # both peers, before us by position, say they are on our CPU
            spreader.spread()
            now = _current_cpu()
            if mine[CPU] == there + 1 and now == there:
                break
        outcome.update(said=mine[CPU] - 1, now=now, mask=os.sched_getaffinity(0),
                       oversubscribed=spreader.oversubscribed)

    thread = threading.Thread(target=crowded_then_spread)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome["said"] == there
    assert outcome["now"] == there
    assert outcome["mask"] == {here, there}
    assert outcome["oversubscribed"] == (3 > len(cpus))
    assert os.sched_getaffinity(0) == set(cpus)  # the test's own thread never moved


def test_spreading_stays_when_the_host_is_balanced() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    mine, peer = _header(), _header()
    outcome: dict[str, object] = {}

    def spread() -> None:
        os.sched_setaffinity(0, {cpus[0]})
        peer[CPU] = cpus[1] + 1
        Spreader(mine, 0, [(1, peer)]).spread()
        outcome.update(said=mine[CPU] - 1, mask=os.sched_getaffinity(0))

    thread = threading.Thread(target=spread)
    thread.start()
    thread.join(timeout=30)
    assert outcome == {"said": cpus[0], "mask": {cpus[0]}}


# The waiting instance and the peer it waits for, on one CPU, both SCHED_FIFO at one priority: the peer runs only
# when the waiter yields (no time slices among equal FIFO tasks), so a waiter that only reads the word times out.
_SHARED_CPU_WAIT = r"""
import mmap, os, sys, time
from simipu.fabric.algorithms.waits import alone_waiter
from simipu.fabric.algorithms.placement import Spreader
os.sched_setaffinity(0, {int(sys.argv[1])})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
words = memoryview(mmap.mmap(-1, 16)).cast("Q")  # (anonymous and shared: the child's writes are ours)
child = os.fork()
if child == 0:  # the peer: publishes once it runs after the waiter said go (it inherits the CPU and FIFO)
    give_up = time.monotonic() + 10
    while not words[1] and time.monotonic() < give_up:
        os.sched_yield()
    words[0] = 1
    os._exit(0)
words[1] = 1  # go: from here on the peer publishes as soon as it gets the CPU
headers = [memoryview(bytearray(64)).cast("Q") for _ in range(2)]  # (the peer's CPU unknown: no move)
seen = alone_waiter(Spreader(headers[0], 0, [(1, headers[1])]).beside)(words, 0, 1, 0.05, headers[1])
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
os.waitpid(child, 0)
print(child, "seen" if seen else "timed out")
"""


def test_a_waiter_lets_a_peer_on_its_own_cpu_publish() -> None:
    """With a CPU for each instance, the board's wait does not yield at first (a yield costs a small call a
    fifth), but the kernel may still put the two instances of a job on one CPU when another process holds the
    other; the wait then yields after its first ``ALONE_SECONDS``, so the peer publishes within the spin."""
    if os.geteuid() != 0:
        pytest.skip("needs root: SCHED_FIFO pins the order in which the waiter and its peer run")
    cpu = min(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", _SHARED_CPU_WAIT, str(cpu)], capture_output=True, text=True,
                          timeout=60, start_new_session=True)
    if "Operation not permitted" in done.stderr:
        pytest.skip("needs SCHED_FIFO, which this cgroup does not grant: " + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    child, outcome = done.stdout.split()
    assert outcome == "seen"
    assert_all_gone([int(child)])


def test_a_wait_beside_its_peer_moves_the_later_instance_away() -> None:
    """A wait that finds the peer it waits for said it was on our CPU (``Spreader.beside``): the later of the two
    by position moves to the other CPU and gives back its mask; the earlier stays where it is."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to move between")
    here, there = cpus[0], cpus[1]
    outcome: dict[int, dict[str, object]] = {}

    def wait_beside(position: int) -> None:  # in its own thread: affinity is per thread
        mine, peer = _header(), _header()
        await_alone = alone_waiter(Spreader(mine, position, [(1 - position, peer)]).beside)
        never = memoryview(bytearray(8)).cast("Q")
        for _ in range(5):  # (the kernel may move the thread between our pin and the wait: then again)
            os.sched_setaffinity(0, {here})
            os.sched_setaffinity(0, {here, there})
            peer[CPU] = here + 1
            seen = await_alone(never, 0, 1, 1e-3, peer)
            if _current_cpu() == (there if position else here):
                break
        outcome[position] = dict(seen=seen, said=mine[CPU] - 1, now=_current_cpu(), mask=os.sched_getaffinity(0))

    for position in (0, 1):
        thread = threading.Thread(target=wait_beside, args=(position,))
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert outcome[1] == dict(seen=False, said=there, now=there, mask={here, there})
    assert outcome[0] == dict(seen=False, said=here, now=here, mask={here, there})


_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nprint(flush=True)\nwhile True: pass\n"


def _two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    return cpus[0], cpus[1]


def _beside_a_busy_process(there: int, instances: int, program: str, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """``program`` under poprun with ``instances`` instances while another process is busy pinned to CPU ``there``
    (killed after, and checked gone); the launch's result."""
    busy = subprocess.Popen([sys.executable, "-c", _BUSY, str(there)], stdout=subprocess.PIPE)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == b"\n"  # (pinned, from here on busy)
        result = run_poprun("--offline-mode=1", "--num-instances", str(instances), "--num-replicas", str(instances),
                            *python_program(program, *argv))
    finally:
        busy.kill()
        busy.wait(timeout=30)
    assert_all_gone([busy.pid])
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    return result


def test_two_instances_the_kernel_keeps_on_one_cpu_part() -> None:
    """Two instances on one CPU of two, another process busy on the other: before, each wait spun its first
    ``ALONE_SECONDS`` while the peer it waited for could not run, and the kernel kept them so for the whole job
    (a 4 KiB allreduce took 55-63 us a call at the median, against 4-5 apart). Now the later one moves."""
    here, there = _two_cpus()
    result = _beside_a_busy_process(there, 2, "cpu_neighbours.py", str(here), str(there))
    record, = (json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{"))
    assert record["masks"] == [[here, there]] * 2, record
    # (the first wait finds them together; the kernel may put them back together now and then, for a call or two)
    assert record["together"] < record["calls"] // 10, record


def test_a_crowded_broadcast_root_waits_for_a_slow_reader_instead_of_sending_by_socket() -> None:
    """Four instances on two CPUs, another process busy on one: a reader often runs only after the busy process's
    time slice, so the root found the reader's mailbox full for longer than the spin, and its frame took the
    socket; the reader then waited its whole spin for a frame that was not coming to its mailbox, and so on, call
    after call (1,506-1,517 of 2,000 broadcasts fell back on the root; 218-260 us a 4 KiB broadcast at the median,
    mpi4py 25-30 us). Now the crowded root waits longer for a slot (60-132 fell back; 14-24 us a call)."""
    here, there = _two_cpus()
    result = _beside_a_busy_process(there, 4, "crowded_broadcast.py", str(here), str(there))
    records = sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")),
                     key=lambda r: r["instance"])
    assert [r["instance"] for r in records] == [0, 1, 2, 3] and all(r["wrong"] == [] for r in records), records
    assert records[0]["fallbacks"] < records[0]["calls"] // 4, records
