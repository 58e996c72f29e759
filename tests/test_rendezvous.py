"""The job's rendezvous, over real sockets: check-in, refusal, start-up deadline, losses."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from simipu.fabric import Peer, PeerLostError, RendezvousError, RendezvousTimeout
from simipu.fabric.join.messages import LEAVE_REASONS, FrameReader, challenge_answer, encode_frame
from simipu.fabric.join.rendezvous import RendezvousServer, join

TOKEN = os.urandom(32)
BOUND = 10.0  # seconds: every wait in these tests is bounded by this


def peer(i: int) -> Peer:
    return Peer(i, "host-a", "localhost", ("127.0.0.1", 40000 + i), None, 1000 + i)


@pytest.fixture
def server_factory():
    servers = []

    def make(n: int, **kwargs) -> RendezvousServer:
        server = RendezvousServer(n, TOKEN, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def rendezvous_log():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("poprun.rendezvous")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def join_all(server: RendezvousServer, indices, n: int, **kwargs):
    with ThreadPoolExecutor(len(indices)) as pool:
        futures = [pool.submit(join, server.address, TOKEN, peer(i), n, job_id="j", timeout=BOUND, **kwargs) for i in indices]
        return [f.result(timeout=BOUND) for f in futures]


def wait_readable(fd: int) -> bool:
    readable, _, _ = select.select([fd], [], [], BOUND)
    return bool(readable)


def test_every_instance_gets_the_same_peer_table(server_factory) -> None:
    server = server_factory(4)
    joined = join_all(server, range(4), 4)
    tables = {m.peers for m, _ in joined}
    assert len(tables) == 1 and [p.instance for p in tables.pop()] == [0, 1, 2, 3]
    assert [m.instance for m, _ in joined] == [0, 1, 2, 3]
    for _, channel in joined:
        channel.close()


def test_a_connection_without_the_token_is_refused_and_logged(server_factory, rendezvous_log) -> None:
    server = server_factory(1)
    with pytest.raises(RendezvousError, match="does not know this job's token"):
        join(server.address, b"wrong", peer(0), 1, job_id="j", timeout=BOUND)
    assert any("refused a fabric connection" in r.getMessage() for r in rendezvous_log)
    membership, channel = join(server.address, TOKEN, peer(0), 1, job_id="j", timeout=BOUND)
    assert membership.num_instances == 1
    channel.close()


def test_the_token_never_crosses_the_wire(server_factory) -> None:
    server = server_factory(1)
    with socket.create_connection(server.address, timeout=BOUND) as sock:
        reader = FrameReader()
        hello = reader.feed(sock.recv(65536))[0]
        nonce = bytes.fromhex(hello["nonce"])
        sent = encode_frame({"auth": challenge_answer(TOKEN, nonce), "peer": vars(peer(0)) | {"tcp_addr": ["127.0.0.1", 1]},
                             "num_instances": 1})
        assert TOKEN not in sent and TOKEN.hex().encode() not in sent
        sock.sendall(sent)
        answer = reader.feed(sock.recv(65536))[0]
        assert [p["instance"] for p in answer["peers"]] == [0]


def test_missing_instances_are_named_when_start_up_times_out(server_factory) -> None:
    timeouts = []
    server = server_factory(3, checkin_timeout=0.5, on_timeout=lambda missing, message: timeouts.append(missing))
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(join, server.address, TOKEN, peer(i), 3, job_id="j", timeout=BOUND) for i in (0, 1)]
        for future in futures:
            with pytest.raises(RendezvousTimeout, match="instances 2 did not check in") as info:
                future.result(timeout=BOUND)
            assert info.value.missing == (2,)
    assert timeouts == [(2,)]


@pytest.mark.parametrize("startup_timeout", [0.001, 0.3])
def test_an_instance_given_the_start_up_timeout_hears_the_rendezvous_name_the_missing(server_factory,
                                                                                     startup_timeout) -> None:
    """An instance joins with the same start-up timeout as the rendezvous (as under poprun). Before, its own
    clock, started when it connected (before its check-in, from which the rendezvous counts), ran out first:
    "timed out waiting for the job's rendezvous", and poprun reported the instance's exit 1, not the start-up
    timeout (79), whenever that exit was seen first."""
    server = server_factory(2, checkin_timeout=startup_timeout)
    with pytest.raises(RendezvousTimeout, match="instances 1 did not check in") as info:
        join(server.address, TOKEN, peer(0), 2, job_id="j", timeout=startup_timeout)
    assert info.value.missing == (1,)


@pytest.mark.parametrize("exits_first", [True, False], ids=["before any check-in", "while the others wait"])
def test_an_instance_that_exits_without_checking_in_fails_start_up_at_once(server_factory, exits_first) -> None:
    """The launcher says instance 2 exited cleanly, never having checked in: the others' joins fail naming it,
    where before they waited out the start-up deadline (an hour here)."""
    server = server_factory(3, checkin_timeout=3600, exit_grace=0)
    if exits_first:
        server.instance_exited(2, "with code 0")
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(join, server.address, TOKEN, peer(i), 3, job_id="j", timeout=BOUND) for i in (0, 1)]
        if not exits_first:
            server.instance_exited(2, "with code 0")
        for future in futures:
            with pytest.raises(RendezvousError, match="instance 2 exited with code 0, without joining the fabric, "
                                                      "so no collective of the whole job can complete") as info:
                future.result(timeout=BOUND)
            assert not isinstance(info.value, RendezvousTimeout)


def test_an_exit_reported_before_the_instances_check_in_does_not_fail_it_within_the_grace(server_factory) -> None:
    """An instance may check in and exit at once (from another host, its check-in may come after the launcher
    heard of the exit): within the grace, its check-in still counts, and the job starts."""
    server = server_factory(3, exit_grace=3600)
    server.instance_exited(2, "with code 0")
    for _, channel in join_all(server, range(3), 3):
        assert channel.lost() == {}
        channel.close()


def test_an_exit_nobody_waits_for_leaves_the_rendezvous_asleep() -> None:
    """An instance exited without checking in and no other has checked in (a job that never uses the fabric):
    the rendezvous sleeps until its next heartbeat round. Before, the exit's passed grace was its next deadline,
    always due: its thread spun (poprun used 2.9 s of CPU in a 4 s job)."""
    server = RendezvousServer(2, TOKEN, exit_grace=0)  # (not started: the test runs its loop's steps)
    try:
        server.instance_exited(1, "with code 0")
        server._check_deadlines()
        assert server._next_timeout() > 0
    finally:
        server.close()


def test_a_duplicate_instance_is_refused(server_factory) -> None:
    server = server_factory(2)
    joined = join_all(server, range(2), 2)
    with pytest.raises(RendezvousError, match="instance 0 has already checked in"):
        join(server.address, TOKEN, peer(0), 2, job_id="j", timeout=BOUND)
    for _, channel in joined:
        assert channel.lost() == {}  # the refused duplicate did not disturb the job
        channel.close()


def test_a_vanished_instance_is_reported_to_the_others(server_factory) -> None:
    server = server_factory(3)
    (m0, c0), (m1, c1), (m2, c2) = join_all(server, range(3), 3)
    c2._sock.close()  # as if the process died: no clean leave
    for channel in (c0, c1):
        assert wait_readable(channel.wake_fd)
        assert 2 in channel.lost()
        with pytest.raises(PeerLostError, match="instance 2 is gone"):
            channel.raise_if_lost()
    c0.close(), c1.close()


def test_every_loss_wakes_the_members_again(server_factory) -> None:
    """The wake fd signals each loss: once drained, it stays quiet until the next one (no re-check timers)."""
    server = server_factory(4)
    (_, c0), (_, c1), (_, c2), (_, c3) = join_all(server, range(4), 4)
    c3.abandon()  # leaves without a goodbye: a loss, told to the others at once
    assert wait_readable(c0.wake_fd) and 3 in c0.lost()
    c0.clear_wake()
    assert not select.select([c0.wake_fd], [], [], 0)[0] and c0.lost().keys() == {3}
    c2._sock.close()  # as if the process died
    assert wait_readable(c0.wake_fd) and c0.lost().keys() == {2, 3}
    with pytest.raises(PeerLostError, match="instance 2 is gone"):
        c0.raise_if_lost({1, 2})
    assert not select.select([c0.wake_fd], [], [], 0)[0], "raise_if_lost left the wake fd readable"
    for channel in (c0, c1, c2):
        channel.close()


def test_a_clean_leave_is_not_a_loss_and_the_others_hear_why(server_factory) -> None:
    """A goodbye is relayed as a leave, with its reason (a code from a known set, else "closed"), never as a
    loss: a wait still on the leaver then says why it is gone (``LossWatch.explain``)."""
    server = server_factory(3)
    (m0, c0), (m1, c1), (m2, c2) = join_all(server, range(3), 3)
    c1.close(why="finalized")
    assert wait_readable(c0.wake_fd) and wait_readable(c2.wake_fd)
    for channel in (c0, c2):
        assert channel.lost() == {} and list(channel.left()) == [1]
        assert "popdist.finalizeBackend()" in channel.left()[1]
    c0.clear_wake()
    c2.close(why="anything else")
    assert wait_readable(c0.wake_fd)
    assert c0.lost() == {} and c0.left()[2] == LEAVE_REASONS["closed"]
    c0.close()


def test_a_silent_instance_is_lost_after_the_heartbeat_timeout(server_factory) -> None:
    server = server_factory(2, heartbeat_timeout=1.5)
    result = {}
    thread = threading.Thread(target=lambda: result.update(j=join(server.address, TOKEN, peer(0), 2, job_id="j", timeout=BOUND)))
    thread.start()
    # instance 1 checks in by hand and then says nothing: its host "went away"
    with socket.create_connection(server.address, timeout=BOUND) as silent:
        reader = FrameReader()
        nonce = bytes.fromhex(reader.feed(silent.recv(65536))[0]["nonce"])
        silent.sendall(encode_frame({"auth": challenge_answer(TOKEN, nonce),
                                     "peer": {**vars(peer(1)), "tcp_addr": ["127.0.0.1", 1]}, "num_instances": 2}))
        thread.join(BOUND)
        _, channel = result["j"]
        assert wait_readable(channel.wake_fd)
        assert "no heartbeat" in channel.lost()[1]
    channel.close()


def test_the_launcher_going_away_wakes_the_members(server_factory) -> None:
    server = server_factory(1)
    _, channel = join(server.address, TOKEN, peer(0), 1, job_id="j", timeout=BOUND)
    server.close()
    assert wait_readable(channel.wake_fd)
    assert -1 in channel.lost()
    channel.close()


def test_unreachable_rendezvous_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = sock.getsockname()  # bound but not listening: connection refused
        with pytest.raises(RendezvousError, match="cannot reach"):
            join(address, TOKEN, peer(0), 1, job_id="j", timeout=BOUND)


def test_on_every_network_it_takes_ipv4_and_ipv6_check_ins(server_factory) -> None:
    """Bound on "" (the launcher's hosts are on several networks), instances reach it by either family."""
    if not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 sockets here")
    server = server_factory(2, bind_host="")
    port = server.address[1]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(join, (host, port), TOKEN, peer(i), 2, job_id="j", timeout=BOUND)
                   for i, host in enumerate(("127.0.0.1", "::1"))]
        joined = [f.result(timeout=BOUND) for f in futures]
    assert [m.instance for m, _ in joined] == [0, 1]
    for _, channel in joined:
        channel.close()
