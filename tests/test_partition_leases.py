"""Launches that share a V-IPU service: each holds its partition for its life, and no one else touches it.

Real poprun processes whose instances report in over a Unix socket and run
until the test lets them go, so every launch is provably running at once.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from poprun_py import errors
from simipu.vipu import VipuService
from simipu.vipu.testing import server_process, start_server_process, stop_process
from support import RUN_TIMEOUT, poprun_command, python_program, run_poprun


def state_file(state_home: str | None = None) -> Path:
    return Path(state_home or os.environ["XDG_STATE_HOME"]) / "poprun-py" / "vipu.sqlite"


class Gate:
    """A Unix socket the instances report to; they run until the gate closes their connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.arrived: list[tuple[str, int]] = []  # (partition, instance pid)
        self._connections: list[socket.socket] = []

    def wait_for(self, count: int, launches: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
        """Accept ``count`` instances; fail at once if a launch ends first (it could not have reported)."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while len(self.arrived) < count:
                ended = [(p.args, p.returncode, p.stderr.read()) for p in launches if p.poll() is not None]
                assert not ended, f"a launch ended while others ran: {ended}"
                assert time.monotonic() < deadline, f"only {len(self.arrived)} of {count} instances reported"
                if not selector.select(1.0):  # wake up now and then to notice a launch that failed
                    continue
                connection, _ = self.listener.accept()
                connection.settimeout(30)
                line = b""
                while not line.endswith(b"\n"):
                    chunk = connection.recv(256)
                    assert chunk, "an instance hung up before reporting"
                    line += chunk
                partition, pid = line.decode().split()
                self.arrived.append((partition, int(pid)))
                self._connections.append(connection)

    def open(self) -> None:
        """Let every instance finish."""
        for connection in self._connections:
            connection.close()
        self._connections.clear()

    def close(self) -> None:
        self.open()
        self.listener.close()


@pytest.fixture
def gate(tmp_path: Path):
    opened = Gate(tmp_path / "gate")
    yield opened
    opened.close()


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(poprun_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def finish(launches: list[subprocess.Popen[bytes]]) -> list[tuple[int, bytes]]:
    results = []
    for launch in launches:
        try:
            _, err = launch.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            launch.kill()
            _, err = launch.communicate()
        results.append((launch.returncode, err))
    return results


def test_eight_concurrent_launches_each_get_their_own_partition(gate: Gate) -> None:
    env = {**os.environ, "RELEASE_SOCKET": str(gate.path)}
    launches = [start("-v", "--num-replicas", "4", *python_program("hold_until_released.py"), env=env)
                for _ in range(8)]
    try:
        gate.wait_for(8, launches)
        held = VipuService(state_file()).list_partitions()
        # eight partitions, one per launch, none adopted by another launch, none reset under a running job
        assert sorted(p.name for p in held) == sorted(name for name, _ in gate.arrived)
        assert len(held) == 8 and all(p.reset_count == 0 for p in held)
        assert all(p.lease is not None and len(p.holders) == 1 for p in held)
        gate.open()
    finally:
        results = finish(launches)
    assert [code for code, _ in results] == [0] * 8, [err.decode() for _, err in results]
    assert not any(b"Resetting" in err or b"only one available" in err for _, err in results)
    assert VipuService(state_file()).list_partitions() == []


def test_a_killed_launchs_temporary_partition_is_reclaimed_not_adopted(gate: Gate) -> None:
    env = {**os.environ, "RELEASE_SOCKET": str(gate.path)}
    first = start("-v", "--num-replicas", "4", *python_program("hold_until_released.py"), env=env)
    try:
        gate.wait_for(1, [first])
        leftover, instance = gate.arrived[0]
        first.send_signal(signal.SIGKILL)  # no clean-up at all: the partition stays in the state file
        first.wait(RUN_TIMEOUT)
    finally:
        gate.open()  # its instance ends too
        finish([first])
    try:
        psutil.Process(instance).wait(RUN_TIMEOUT)  # the gate is open: it ends
    except psutil.NoSuchProcess:
        pass

    second = run_poprun("-v", "--num-replicas", "4", "true")
    assert second.returncode == 0, second.stderr.decode()
    assert b"only one available" not in second.stderr  # not adopted
    assert b"Created partition" in second.stderr and leftover.encode() not in second.stderr
    assert VipuService(state_file()).list_partitions() == []  # the leftover was reclaimed, the new one removed


def test_two_state_directories_cannot_hold_the_same_partition_of_one_server(
        tmp_path: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    home_a, home_b = tmp_path / "alice", tmp_path / "bob"
    env_a = {**os.environ, "XDG_STATE_HOME": str(home_a), "RELEASE_SOCKET": str(gate.path)}
    state = tmp_path / "server.sqlite"
    monkeypatch.setenv("XDG_STATE_HOME", str(home_a))  # the server (started below) keeps its token there
    with server_process(state) as server:
        shared = ["--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server.port),
                  "--vipu-partition", "shared", "--remove-partition=no", "--num-replicas", "4"]
        first = start(*shared, *python_program("hold_until_released.py"), env=env_a)
        try:
            gate.wait_for(1, [first])
            # another state directory (another user's, say) with the server's credential
            token = home_a / "poprun-py" / "vipu-server.token"
            env_b = {**os.environ, "XDG_STATE_HOME": str(home_b), "SIMIPU_VIPU_TOKEN_FILE": str(token)}
            second = run_poprun(*shared, "sh", "-c", "echo second ran", env=env_b)
            partition = VipuService(state).get_partition("shared")
        finally:
            gate.open()
            (code, err), = finish([first])
    assert second.returncode == errors.EXIT_NO_DEVICES, second.stderr.decode()
    assert b"second ran" not in second.stdout
    assert f"in use by pid {first.pid}".encode() in second.stderr
    assert partition.reset_count == 0  # the running job's partition was not reset under it
    assert code == 0, err.decode()


def test_a_partition_left_behind_by_a_server_down_at_the_end_is_reclaimed(tmp_path: Path, gate: Gate) -> None:
    state = tmp_path / "server.sqlite"
    env = {**os.environ, "RELEASE_SOCKET": str(gate.path)}
    running = start_server_process(state)
    where = ["--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(running.port), "--num-replicas", "4"]
    try:
        first = start("-v", *where, *python_program("hold_until_released.py"), env=env)
        gate.wait_for(1, [first])
        leftover = gate.arrived[0][0]
    finally:
        stop_process(running.process)  # the server goes away while the job runs
        gate.open()
    (code, err), = finish([first])
    assert code == 0 and f"could not remove partition {leftover}".encode() in err  # a warning, not the job's result
    with server_process(state, port=running.port) as again:
        second = run_poprun("-v", *where, "true")
        assert second.returncode == 0, second.stderr.decode()
        assert b"only one available" not in second.stderr
        assert again.client().list_partitions() == []  # the leftover was reclaimed, the new one removed
