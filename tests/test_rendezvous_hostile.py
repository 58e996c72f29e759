"""Hostile input to a real rendezvous: each bad connection costs only itself; the job starts and still
sees losses. Ends with a fuzz of the parser for what a connection sends before it has authenticated."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simipu.fabric.join.checkin import SPARE_PENDING, CheckIn, checkin_reader, parse_checkin
from simipu.fabric.join.messages import FrameReader, challenge_answer, encode_frame
from simipu.fabric.join.rendezvous import join
from support import program, read_line
from test_rendezvous import BOUND, TOKEN, peer, rendezvous_log, server_factory  # noqa: F401  (fixtures)


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def opened(address: tuple[str, int]) -> tuple[socket.socket, bytes]:
    """A connection to the rendezvous that has read its challenge: the socket and the nonce."""
    sock = socket.create_connection(address, timeout=BOUND)
    reader = FrameReader()
    while (hello := reader.pop()) is None:
        reader.add(sock.recv(4096))
    return sock, bytes.fromhex(hello["nonce"])


def closed_by_server(sock: socket.socket) -> bool:
    """Read until the rendezvous closes the connection (True), failing after BOUND seconds."""
    sock.settimeout(BOUND)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def check_in_frame(nonce: bytes, index: int, n: int, **changes: object) -> bytes:
    """Instance ``index``'s check-in, right but for ``changes`` (to the message or its peer entry)."""
    entry = {**vars(peer(index)), "tcp_addr": ["127.0.0.1", 40000 + index]}
    message = {"auth": challenge_answer(TOKEN, nonce), "peer": entry, "num_instances": n}
    for key, value in changes.items():
        if key in message:
            message[key] = value
        else:
            entry[key] = value
    return encode_frame(message)


#: What a connection sends after reading its challenge, by kind of attack.
HOSTILE: dict[str, Callable[[bytes], bytes]] = {
    "deep nesting": lambda nonce: frame(b'{"auth":' + b"[" * 3000 + b"]" * 3000 + b"}"),
    "non-ASCII auth": lambda nonce: encode_frame({"auth": "\u00e9" * 64, "peer": {}, "num_instances": 1}),
    "instance Infinity": lambda nonce: check_in_frame(nonce, 0, 1, instance=float("inf")),
    "oversized length prefix": lambda nonce: struct.pack("!I", (4 << 20) - 1) + b"{" * 4096,
    "half-sent frame": lambda nonce: struct.pack("!I", 300) + b'{"auth":"',
    "not JSON": lambda nonce: frame(b"\xff\xfe{"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_connection_is_closed_and_costs_only_itself(server_factory, kind: str) -> None:
    server = server_factory(1)
    sock, nonce = opened(server.address)
    with sock:
        sock.sendall(HOSTILE[kind](nonce))
        assert closed_by_server(sock)
    membership, channel = join(server.address, TOKEN, peer(0), 1, job_id="j", timeout=BOUND)
    assert membership.num_instances == 1  # the rendezvous still serves
    channel.close()


def test_after_every_kind_of_hostile_frame_the_job_starts_and_sees_a_stopped_peer(server_factory) -> None:
    server = server_factory(2, heartbeat_timeout=2.0)
    hostile = [opened(server.address) for _ in HOSTILE]
    for (sock, nonce), make in zip(hostile, HOSTILE.values()):
        sock.sendall(make(nonce))
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(
        joined=join(server.address, TOKEN, peer(0), 2, job_id="j", timeout=BOUND)), daemon=True)
    thread.start()
    stopped, nonce = opened(server.address)  # instance 1 checks in by hand, then stops (no heartbeats)
    with stopped:
        stopped.sendall(check_in_frame(nonce, 1, 2))
        thread.join(BOUND)
        assert "joined" in result, "instance 0 could not join after the hostile connections"
        _, channel = result["joined"]  # type: ignore[misc]
        poller = select.poll()
        poller.register(channel.wake_fd)
        assert poller.poll(BOUND * 1000), "the stopped instance was never reported lost"
        assert "no heartbeat" in channel.lost()[1]
        channel.close()
    for sock, _ in hostile:
        assert closed_by_server(sock)
        sock.close()


def test_connections_waiting_to_check_in_are_capped(server_factory) -> None:
    """Past the cap the oldest waiter is closed (long before its deadline), so idle connections cost
    the launcher a bounded number of descriptors and buffers; the job still starts."""
    server = server_factory(1, checkin_frame_deadline=60)
    extra = 20
    idle = [opened(server.address)[0] for _ in range(1 + SPARE_PENDING + extra)]
    try:
        for sock in idle[:extra]:
            assert closed_by_server(sock)
        membership, channel = join(server.address, TOKEN, peer(0), 1, job_id="j", timeout=BOUND)
        assert membership.num_instances == 1
        channel.close()
    finally:
        for sock in idle:
            sock.close()


def test_a_stalled_check_in_is_closed_at_its_deadline(server_factory) -> None:
    server = server_factory(1, checkin_frame_deadline=0.2)
    sock, _ = opened(server.address)
    with sock:
        sock.sendall(struct.pack("!I", 100) + b"{")  # and nothing more
        assert closed_by_server(sock)


def test_refusals_are_logged_once_per_peer(server_factory, rendezvous_log) -> None:
    server = server_factory(1)
    for _ in range(5):
        sock, _ = opened(server.address)
        with sock:
            sock.sendall(encode_frame({"auth": "0" * 64}))
            assert closed_by_server(sock)
    warnings = [r for r in rendezvous_log if r.levelname == "WARNING" and "refused" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "127.0.0.1" in warnings[0].getMessage()


def test_running_out_of_descriptors_pauses_accepting_and_the_job_still_starts() -> None:
    """The rendezvous runs in a process that can open only 4 more descriptors; 12 idle connections make
    accept() fail with EMFILE. Once they go, two instances join and a loss is still reported."""
    token = os.urandom(32)
    server = subprocess.Popen([sys.executable, program("rendezvous_alone.py"), "2", "4"],
                              env=dict(os.environ, FABRIC_TOKEN=token.hex()),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        address = ("127.0.0.1", json.loads(read_line(server.stdout, BOUND))["port"])
        idle = [socket.create_connection(address, timeout=BOUND) for _ in range(12)]
        idle[0].recv(4096)  # the first was accepted: the rendezvous is serving
        for sock in idle:
            sock.close()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(join, address, token, peer(i), 2, job_id="j", timeout=BOUND) for i in (0, 1)]
            (_, first), (_, second) = (future.result(timeout=BOUND) for future in futures)
        second.abandon()  # leaves without a goodbye: instance 0 hears of it only if the rendezvous lives
        poller = select.poll()
        poller.register(first.wake_fd)
        assert poller.poll(BOUND * 1000) and 1 in first.lost()
        first.close()
        server.stdin.close()
        assert server.wait(BOUND) == 0
        assert b"cannot accept connections for now" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(BOUND)
        server.stdout.close()
        server.stderr.close()


# -- the fuzz ------------------------------------------------------------------------------------------

NUM_INSTANCES = 4
NONCE = bytes(range(32))
RIGHT = challenge_answer(TOKEN, NONCE)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
valid_peers = st.fixed_dictionaries({
    "instance": st.integers(0, NUM_INSTANCES - 1),
    "host_id": st.text(min_size=1, max_size=30),
    "hostname": st.text(min_size=1, max_size=30),
    "tcp_addr": st.tuples(st.text(min_size=1, max_size=20), st.integers(1, 65535)).map(list),
    "unix_name": st.none() | st.text(min_size=1, max_size=30),
    "pid": st.integers(1, 2**22),
})
MISSING = object()
#: (where, key, new value): a change to a valid check-in; MISSING deletes the key.
changes = st.tuples(st.sampled_from(["message", "peer"]),
                    st.sampled_from(["auth", "peer", "num_instances", "instance", "host_id", "hostname",
                                     "tcp_addr", "unix_name", "pid", "extra"]),
                    st.just(MISSING) | json_values)


def changed(message: dict, edits: list) -> dict:
    for where, key, value in edits:
        target = message if where == "message" or not isinstance(message.get("peer"), dict) else message["peer"]
        if value is MISSING:
            target.pop(key, None)
        else:
            target[key] = value
    return message


check_ins = st.builds(
    changed,
    st.fixed_dictionaries({"auth": st.just(RIGHT) | st.text(max_size=70), "peer": valid_peers,
                           "num_instances": st.just(NUM_INSTANCES)}),
    st.lists(changes, max_size=3),
)
bodies = (
    check_ins.map(lambda message: json.dumps(message).encode())
    | st.integers(1, 6000).map(lambda depth: b'{"auth":' + b"[" * depth + b"]" * depth + b"}")
    | st.binary(max_size=200)
)
streams = (
    bodies.map(frame)
    | st.tuples(bodies.map(frame), st.integers(0, 300)).map(lambda cut: cut[0][: cut[1]])  # a frame cut short
    | st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=64)).map(lambda p: struct.pack("!I", p[0]) + p[1])
)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams, st.integers(1, 64))
def test_the_pre_authentication_parser_refuses_rather_than_fails(stream: bytes, chunk: int) -> None:
    """Whatever a stranger sends, in whatever pieces: a check-in, nothing yet, or ValueError (a refusal)."""
    reader = checkin_reader()
    try:
        for start in range(0, len(stream), chunk):
            reader.add(stream[start : start + chunk])
        message = reader.pop()
        result = None if message is None else parse_checkin(message, TOKEN, NONCE, NUM_INSTANCES)
    except ValueError:  # Refused included
        return
    if result is not None:
        assert isinstance(result, CheckIn) and message["auth"] == RIGHT
        assert 0 <= result.instance < NUM_INSTANCES and 0 < result.peer.tcp_addr[1] < 65536
        assert all(isinstance(text, str) for text in (result.peer.host_id, result.peer.hostname))

