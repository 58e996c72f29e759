"""The V-IPU server as a process: restarts, concurrent allocators, the wire, unreachable servers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from simipu.cli import EXIT_CANNOT_LISTEN, EXIT_CODES
from simipu.vipu import (
    NotAVipuServer,
    NotEnoughIpus,
    PartitionRequest,
    VipuClient,
    VipuProtocolError,
    VipuService,
    VipuUnreachable,
)
from simipu.vipu.server import VipuServer
from simipu.vipu.testing import concurrent_allocations, server_process, start_server_process, stop_process
from support import skip_without_ipv6_loopback


def _assert_no_ipu_twice(outcomes: list[dict[str, object]], granted: int) -> None:
    ok = [o for o in outcomes if "ipus" in o]
    refused = [o for o in outcomes if "ipus" not in o]
    assert all(o["error"] == NotEnoughIpus.kind for o in refused), refused
    ipus = [ipu for o in ok for ipu in o["ipus"]]  # type: ignore[union-attr]
    assert len(ipus) == len(set(ipus)), "an IPU was given to two partitions"
    assert len(ok) == granted


def test_many_processes_allocating_from_one_state_file(tmp_path: Path) -> None:
    # 6 processes x 4 partitions of 4 IPUs = 96 IPUs asked of a POD64: exactly 16 fit.
    outcomes = concurrent_allocations(["--state", str(tmp_path / "vipu.sqlite")], processes=6, count=4, size=4)
    assert len(outcomes) == 24
    _assert_no_ipu_twice(outcomes, granted=16)
    stored = VipuService(tmp_path / "vipu.sqlite").list_partitions()
    assert sorted(ipu for p in stored for ipu in p.ipus) == list(range(64))


def test_many_processes_allocating_through_one_server(tmp_path: Path) -> None:
    with server_process(tmp_path / "vipu.sqlite", cluster="pod16") as server:
        outcomes = concurrent_allocations(["--server", server.address], processes=6, count=3, size=2)
        assert len(outcomes) == 18
        _assert_no_ipu_twice(outcomes, granted=8)
        assert len(server.client().list_partitions()) == 8


def test_state_survives_a_killed_server(tmp_path: Path) -> None:
    state = tmp_path / "vipu.sqlite"
    first = start_server_process(state)
    try:
        client = first.client()
        created = client.create_partition(PartitionRequest("p16", 16, num_gcds=2))
        client.mark_failed("p16")
        client.create_partition(PartitionRequest("p4", 4))
    finally:
        first.process.kill()
        first.process.wait(10)
        stop_process(first.process)
    with server_process(state) as second:
        client = second.client()
        assert [p.name for p in client.list_partitions()] == ["p16", "p4"]
        survivor = client.get_partition("p16")
        assert survivor.ipus == created.ipus and survivor.state == "PS_FAILED"
        assert client.create_partition(PartitionRequest("p32", 32)).ipus == tuple(range(32, 64))


def test_server_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    server = start_server_process(tmp_path / "vipu.sqlite")
    assert stop_process(server.process) == 0


@pytest.mark.parametrize("host", ["::1", "::"])
def test_the_server_listens_on_ipv6(tmp_path: Path, host: str) -> None:
    """Before, it took IPv4 addresses only: "Address family for hostname not supported" (exit 14)."""
    skip_without_ipv6_loopback()
    with server_process(tmp_path / "vipu.sqlite", host=host, cluster="pod16") as server:
        assert (server.host, server.address) == (host, f"[{host}]:{server.port}")  # as it said: listening on [::1]:N
        assert server.client().create_partition(PartitionRequest("p", 2)).size == 2
        assert VipuClient("::1", port=server.port, timeout=10).get_partition("p").size == 2
        if host == "::" and socket.has_dualstack_ipv6():  # every network, IPv4 too, as "::" means to most servers
            assert VipuClient("127.0.0.1", port=server.port, timeout=10).get_partition("p").size == 2


def test_an_ipv6_address_it_cannot_listen_on_is_named_in_brackets(tmp_path: Path) -> None:
    skip_without_ipv6_loopback()
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "simipu.cli", "vipu-server", "--host", "::1", "--port",
                                 str(port), "--state", str(tmp_path / "vipu.sqlite")],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CANNOT_LISTEN, result.stderr
    assert result.stderr.startswith(f"simipu: error: cannot listen on [::1]:{port}: "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_unreachable_server_refusing_connections(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(VipuUnreachable) as caught:
        VipuClient("127.0.0.1", port=port, timeout=5).list_partitions()
    assert caught.value.port == port and f"127.0.0.1:{port}" in str(caught.value)


def test_silent_server_gives_unreachable_within_the_timeout() -> None:
    # A socket that accepts connections (the kernel's backlog) but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        client = VipuClient("127.0.0.1", port=port, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(VipuUnreachable, match="no answer within 0.5 s"):
            client.get_partition("p")
        # Generous bound: the point is that it does not wait for the 10 s default or forever.
        assert time.monotonic() - started < 5


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int]]:
    with VipuServer(VipuService(tmp_path / "vipu.sqlite"), host="127.0.0.1", port=0).start() as server:
        yield server.address


def _raw(address: tuple[str, int], method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", data=body, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_wire_format_of_replies_and_errors(served: tuple[str, int]) -> None:
    status, reply = _raw(served, "POST", "/v1/partitions", json.dumps({"name": "p", "size": 4}).encode())
    assert status == 201 and reply["partition"]["ipus"] == [0, 1, 2, 3]
    assert _raw(served, "GET", "/v1/clusters") == (200, {"clusters": [
        {"name": "cluster0", "size": 64, "num_ilds": 1, "ild_size": 64, "num_m2000s": 16}], "default": "cluster0"})
    status, reply = _raw(served, "POST", "/v1/partitions", json.dumps({"name": "p", "size": 4}).encode())
    assert status == 409 and reply["error"]["kind"] == "partition_exists"
    status, reply = _raw(served, "GET", "/v1/partitions/ghost")
    assert status == 404 and reply["error"]["kind"] == "partition_not_found"
    status, reply = _raw(served, "POST", "/v1/partitions", b"{not json")
    assert status == 400 and reply["error"]["kind"] == "invalid_request"
    status, reply = _raw(served, "GET", "/v2/everything")
    assert status == 404 and reply["error"]["kind"] == "protocol_error"
    assert _raw(served, "POST", "/v1/partitions/p/fail")[1]["partition"]["state"] == "PS_FAILED"
    assert _raw(served, "POST", "/v1/partitions/p/reset")[1]["partition"]["reset_count"] == 1
    assert _raw(served, "DELETE", "/v1/partitions/p")[0] == 200
    assert _raw(served, "GET", "/v1/partitions") == (200, {"partitions": []})


def test_client_reports_a_non_vipu_http_server_as_protocol_error() -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Teapot(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(418)
            self.end_headers()
            self.wfile.write(b"<html>teapot</html>")

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Teapot)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with pytest.raises(VipuProtocolError, match="HTTP 418"):
            VipuClient("127.0.0.1", port=httpd.server_address[1], timeout=5).list_partitions()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@contextmanager
def web_server(directory: Path) -> Iterator[int]:
    """Python's http.server (what `python -m http.server` runs) on a free port: an HTTP server, not V-IPU's."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def test_a_web_server_is_named_as_not_a_vipu_server(tmp_path: Path) -> None:
    """Before: "the V-IPU server at ... answered HTTP 404", a protocol error (simipu exit 12, poprun 77)."""
    with web_server(tmp_path) as port:
        with pytest.raises(NotAVipuServer) as caught:
            VipuClient("127.0.0.1", port=port, timeout=10).list_partitions()
        said = str(caught.value)
        assert said.startswith(f"127.0.0.1:{port} is not a V-IPU server (HTTP 404 for /v1/partitions, Server: "
                               "SimpleHTTP/"), said
        assert isinstance(caught.value, VipuUnreachable)  # nothing was refused by a V-IPU service
        result = subprocess.run([sys.executable, "-m", "simipu.cli", "vipu", "list", "partitions", "--server",
                                 f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODES[VipuUnreachable], result.stderr
    assert result.stderr == f"simipu: error: {said}\n"


def test_a_garbage_status_line_is_not_a_vipu_server_at_once() -> None:
    """Before: the client read on until its timeout, then said "unreachable (no answer within ...)"."""
    done = threading.Event()

    def banner(listener: socket.socket) -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")  # and keeps the connection open, as an SSH server does
            done.wait(60)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=banner, args=(listener,), daemon=True)
        thread.start()
        try:
            with pytest.raises(NotAVipuServer, match=r"is not a V-IPU server \(not an HTTP reply: 'SSH-2.0-OpenSSH"):
                VipuClient("127.0.0.1", port=listener.getsockname()[1], timeout=30).list_partitions()
        finally:
            done.set()
            thread.join(10)
