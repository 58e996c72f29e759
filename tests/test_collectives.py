"""Collectives end to end through poprun: correct, deterministic, never hanging, leak-free."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from poprun_py.errors import EXIT_STARTUP_TIMEOUT
from support import Launch, poprun_command, python_program, read_line, run_poprun

OFFLINE = "--offline-mode=1"
SHM = Path("/dev/shm")


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm():
    before = {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()
    yield
    after = {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()
    assert not {name for name in after - before if name.startswith("poprun")}


def run_checks(instances: int, replicas: int, transport: str) -> dict[int, dict]:
    result = run_poprun(OFFLINE, "--num-instances", str(instances), "--num-replicas", str(replicas),
                        f"--fabric-transport={transport}", *python_program("collectives_check.py"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")]
    assert sorted(r["instance"] for r in records) == list(range(instances))
    return {r["instance"]: r["digests"] for r in records}


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("instances,replicas", [(1, 1), (1, 4), (2, 2), (2, 8), (3, 3), (4, 4), (4, 16)])
def test_every_collective_matches_numpy(instances: int, replicas: int, transport: str) -> None:
    digests = run_checks(instances, replicas, transport)
    # every instance holds bit-identical results (except the parts that are its own by design)
    shared = [{k: v for k, v in d.items() if not k.startswith("own-")} for d in digests.values()]
    assert all(d == shared[0] for d in shared)


def test_rank_and_size_come_from_the_fabric_not_the_environment() -> None:
    """popdist.collectives' and Horovod's rank() and size() are called on every step: once the fabric is
    connected they are its own, equal to the launch's, and never parse the environment again (~25 us a call)."""
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2", *python_program("rank_cost.py"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")),
                     key=lambda r: r["instance"])
    assert [r["instance"] for r in records] == [0, 1]
    for r in records:
        assert r["parses"] == 0 and r["values"] == r["truth"], r


@pytest.mark.parametrize("instances", [2, 3])
def test_repeated_small_calls_skip_the_fabric_methods_and_stay_right(instances: int) -> None:
    """popdist.collectives' allreduce, broadcast and allgather, called again with the same arrays, call the
    board plans themselves (Fabric's methods are entered only by each signature's first calls), with one peer
    (its closure) and two; new values each step, a late peer, a subgroup (the general path) all give exact
    results, and after a mismatch the same hot call raises at once instead of publishing."""
    result = run_poprun(OFFLINE, "--num-instances", str(instances), "--num-replicas", str(instances),
                        *python_program("hot_calls.py"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")),
                     key=lambda r: r["instance"])
    assert [r["instance"] for r in records] == list(range(instances))
    for r in records:
        assert r["wrong"] == [] and r["entered"] == {"allreduce": 2, "broadcast": 2, "allgather": 1}, r
        assert r["subgroup"] == (r["instance"] in {0, instances - 1}), r  # (its members enter Fabric.allreduce)
        assert r["after"] == ["CollectiveMismatchError", "FabricError"], r
        # a hot call is popdist.collectives' frame and the plan's (and, with peers, its publisher's): with one peer
        # the allgather filled its rows in a third frame before (``take_pair``), a twentieth of a 4 KiB call
        publishing = [] if instances == 2 else ["publish"]
        assert r["frames"] == {"allreduce": ["allreduce", "call", *publishing],
                               "allgather": ["allgather", "call", *publishing]}, r


def test_steady_shared_copies_take_the_boards_when_segments_differ_in_size() -> None:
    """A repeated broadcast above a board's size (the root's segment twice the array, its readers' smaller) and
    an allgather after it take the boards once steady: every member's steady announcement is the same bytes
    whatever its segment's size. (Before, each call's frames differed in their tails and every call after the
    first went the general way.) A peer late past the spin still sends a call the general way, which on a loaded
    machine may be most calls: the test asks that some steady call took the boards on every member."""
    result = run_poprun(OFFLINE, "--num-instances", "3", "--num-replicas", "3", *python_program("steady_copies.py"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")]
    assert sorted(r["instance"] for r in records) == [0, 1, 2]
    for r in records:
        assert r["wrong"] == [], r
        assert all(count < r["steps"] - 1 for count in r["fallbacks"].values()), r


@pytest.mark.parametrize("instances", [2, 3])
def test_steady_copies_keep_their_plans_only_while_the_arena_keeps_its_layout(instances: int) -> None:
    """A steady allgather's and broadcast's plans are kept from call to call (the views, slots and checks made
    once), but each first call after another layout, or after every segment grew, goes the general way (the drain
    and the announcement), and every result is right: per round of 5 allgathers and 3 broadcasts, 4 and 2 steady."""
    result = run_poprun(OFFLINE, "--num-instances", str(instances), "--num-replicas", str(instances),
                        *python_program("steady_switches.py"))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")]
    assert sorted(r["instance"] for r in records) == list(range(instances))
    for r in records:
        assert r["wrong"] == [] and r["calls"] == 32 and r["steady"] == 24, r


def test_results_are_bit_identical_across_runs() -> None:
    assert run_checks(3, 6, "auto") == run_checks(3, 6, "auto")


def run_failing(mode: str, *extra: str, argv: tuple[str, ...] = ()) -> subprocess.CompletedProcess[bytes]:
    return run_poprun(OFFLINE, "--num-instances", "3", "--num-replicas", "3", *extra,
                      *python_program("fabric_fail.py", mode, *argv))


def test_a_peer_killed_mid_collective_is_named_in_every_survivor() -> None:
    result = run_failing("killed", "--stop-grace", "30", "--fabric-timeout", "5")
    lines = result.stdout.decode().splitlines()
    lost = [line for line in lines if line.startswith("lost:")]
    assert len(lost) == 2 and all("instance 1 is gone" in line for line in lost), lines
    assert result.returncode == 137  # the first failure: instance 1, SIGKILL
    assert b"instance 1 of 3" in result.stderr


@pytest.mark.parametrize("mode", ["finalized", "exits"])
def test_a_peer_that_left_the_fabric_is_named_with_why(mode: str, tmp_path: Path) -> None:
    """Instance 1 leaves the fabric cleanly (``popdist.finalizeBackend()``, alive after it; or the end of its
    program) while the others enter an allreduce: each says why it is gone. Before, they said its process
    "exited or was killed" though it was alive and had only finalised."""
    result = run_failing(mode, "--fabric-timeout", "30", argv=(str(tmp_path),) if mode == "finalized" else ())
    lost = [line for line in result.stdout.decode().splitlines() if line.startswith("lost:")]
    expected = {"finalized": "instance 1 is gone: it called popdist.finalizeBackend(), so it takes no part",
                "exits": "instance 1 is gone: its program ended (its fabric closed at exit) without this"}[mode]
    assert len(lost) == 2 and all(expected in line for line in lost), result
    assert result.returncode == 3, result.stderr


def test_start_up_timeout_names_the_missing_instance(tmp_path: Path) -> None:
    # (counted from the first check-in: instances 0 and 2 enter init() together, so that a process that starts
    # slowly on a loaded machine is not named too, as instance 2 once was with 1 s and then with 3 s)
    result = run_failing("late", "--startup-timeout", "2", argv=(str(tmp_path),))
    assert result.returncode == EXIT_STARTUP_TIMEOUT, result.stderr
    assert b"instances 1 did not check in to the fabric within 2 s" in result.stderr, result.stderr


def test_an_instance_leaving_without_joining_fails_the_others_first_collective_at_once() -> None:
    """Instance 1 exits with code 0 before any collective: the others' first one fails naming it, not after
    the start-up deadline (600 s here, longer than the run's bound: before, this timed out)."""
    result = run_failing("leaves", "--startup-timeout", "600")
    lines = result.stdout.decode().splitlines()
    refused = [line for line in lines if line.startswith("refused:")]
    assert len(refused) == 2 and all("instance 1 exited with code 0, without joining the fabric" in line
                                     for line in refused), lines
    assert result.returncode == 6, result.stderr


def test_a_peer_holding_the_gil_past_the_fabric_timeout_on_this_host_is_late_not_lost(tmp_path: Path) -> None:
    """Instance 1 holds Python's GIL in a C call (as a huge pickle.load does), so its heartbeats stop, for
    longer than --fabric-timeout: its process is alive on this host, so it is a late peer, and the job goes on
    once it lets go. Before, the others were told "instance 1 is gone: ... its host may be unreachable"."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    command = [*poprun_command(OFFLINE, "-v", "--num-instances", "2", "--num-replicas", "2", "--fabric-timeout", "1",
                               *python_program("fabric_fail.py", "gil", str(fifo)))]
    launch = Launch(argv=["sh", "-c", 'exec "$@" 2>&1', "sh", *command])  # (the log lines in the same stream)
    lines = []
    while not lines or b"not lost" not in lines[-1]:
        line = read_line(launch.process.stdout)
        assert line, f"poprun ended first: {b''.join(lines).decode(errors='replace')}"
        lines.append(line)
    assert b"instance 1 sent no heartbeat for 1 s, but its process on this host is alive" in lines[-1], lines[-1]
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # instance 1's open returns: it lets go of the GIL
    rest = launch.process.stdout.read()
    assert launch.finish() == 0, rest
    assert rest.count(b"second: 2.0") == 2, rest


def test_a_stopped_peer_on_this_host_is_still_lost_by_its_heartbeats() -> None:
    """A peer stopped (SIGSTOP) is not "alive and running": past --fabric-timeout it is lost, as before, and
    its peers are told it is stopped (before: "its host may be unreachable"). poprun's SIGTERM is followed
    by SIGCONT, so the stopped instance runs its handler at once: before, it acted on nothing until the
    SIGKILL after --stop-grace (600 s here, far past this run's time limit)."""
    result = run_failing("stopped", "--fabric-timeout", "1", "--stop-grace", "600")
    lines = result.stdout.decode().splitlines()
    lost = [line for line in lines if line.startswith("lost:")]
    stopped = re.compile(r"instance 1 is gone: no heartbeat for 1 s: its process \(pid \d+\) on this host is "
                         r"stopped \(SIGSTOP or a debugger\)")
    assert len(lost) == 2 and all(stopped.search(line) for line in lost), result
    assert "stopped instance: SIGTERM handled" in lines and b"SIGKILL" not in result.stderr, result
    assert result.returncode == 3, result.stderr


def test_mismatched_shapes_are_an_error_on_every_side() -> None:
    result = run_failing("mismatch")
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("mismatch:")]
    assert lines, result.stderr
    assert all("instance 0" in line and "float32[3]" in line and "float32[4]" in line for line in lines), lines
    assert result.returncode == 4


def test_instances_naming_different_roots_of_a_small_broadcast_never_end_as_if_they_agreed() -> None:
    """Among three instances a small broadcast's root writes and returns (``board_copies.RootBroadcast``), so
    instance 0 (root 0) and instances 1 and 2 (root 1) all return from it. Before, the program then ended with
    code 0 and divergent arrays; now an instance that closes its fabric with a peer's frame of that call still
    unread fails with CollectiveMismatchError naming both roots (of two roots that wrote to each other, one
    sees the other's frame however they are scheduled)."""
    result = run_failing("roots")
    assert result.returncode == 1, result
    assert b"CollectiveMismatchError: instance " in result.stderr, result.stderr
    assert re.search(rb"instance \d closed its fabric \(the end of its program, or popdist.finalizeBackend\(\)\) "
                     rb"but instance \d called broadcast\(root=[01]\) on float64\[4\] as collective #1 of its "
                     rb"group; instance \d never took that frame: its own collective #1 was another call \(the "
                     rb"instances named different roots", result.stderr), result.stderr


def test_a_collective_after_a_small_broadcast_with_different_roots_names_the_roots() -> None:
    """The same broadcast, then a barrier: every instance raises there, and says which broadcast went unread."""
    result = run_failing("roots-then")
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("mismatch:")]
    assert len(lines) == 3, result
    assert all("called barrier as collective #2 of its group but instance" in line
               and "as collective #1; instance" in line and "instances named different roots" in line
               for line in lines), lines
    assert result.returncode == 4


def refusals() -> dict:
    import numpy as np

    import popdist.collectives as C

    out = {}
    for op in ("max", "min"):
        try:
            out[op] = C.allreduce(np.array([1 + 2j, 3 - 1j]), op).tolist()
        except TypeError as error:
            out[op] = str(error)
    swapped = np.arange(5.0).astype(">f8")
    try:
        out["swapped"] = C.allreduce(swapped, out=swapped).tolist()
    except ValueError as error:
        out["swapped"] = str(error)
    out["after"] = C.allreduce(np.ones(2)).tolist()  # (nothing above broke the fabric)
    return out


@pytest.mark.parametrize("instances", [1, 2])
def test_max_of_complex_and_an_out_in_another_byte_order_are_refused_clearly(instances: int) -> None:
    """max and min of complex arrays are refused, as MPI's MAX and MIN (and this project's mpi4py) refuse
    them; before, NumPy's lexicographic order was taken. out= of another byte order than the machine's (in
    place too) says so; before: "out is >f8[5] but the result is float64[5]"."""
    import poprun_py

    for out in poprun_py.launch(refusals, num_instances=instances, timeout=60):
        for op in ("max", "min"):
            assert out[op] == (f"{op} does not reduce a complex128 array: complex numbers have no order (MPI's MAX "
                               "and MIN refuse them too); reduce their abs() or real parts instead"), out
        assert out["swapped"] == ("out is >f8[5], not in this machine's byte order, and results are written in it "
                                  "(float64); for out= (in place too) pass a native-order array "
                                  "(x.astype(x.dtype.newbyteorder('='))), or no out"), out
        assert out["after"] == [instances] * 2


def test_a_connection_without_the_secret_is_refused() -> None:
    result = run_failing("wrong-token", "--startup-timeout", "2")
    assert b"refused" in result.stdout
    assert b"refused a fabric connection" in result.stderr
    assert result.returncode == 5


def test_the_job_token_reaches_instances_but_never_logs_or_argv() -> None:
    result = run_poprun(OFFLINE, "--vv", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                        'echo "$POPRUN_JOB_TOKEN"; tr "\\0" " " < /proc/$PPID/cmdline; echo')
    assert result.returncode == 0
    lines = result.stdout.decode().splitlines()
    tokens = {line for line in lines if len(line) == 64}
    assert len(tokens) == 1  # both instances got the same 64-hex-digit token
    token = tokens.pop()
    assert token.encode() not in result.stderr  # debug logs included
    assert not any(token in line for line in lines if len(line) != 64)  # not in poprun's argv either
