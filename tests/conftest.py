"""Shared test plumbing: bounded poprun runs and a leak check after every test.

Every process a test starts inherits ``POPRUN_TEST_MARKER=<unique id>`` from
the test's environment; after the test, no live process may carry it. A fork
keeps its parent's environment as it was at exec (``/proc/PID/environ``), so
the instances ``poprun_py.launch`` forks from the test process do not carry
it: they are caught as new descendants of the test process instead.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from infra.sshd import SshServer, unavailable_reason, wait_gone, write_config

MARKER = "POPRUN_TEST_MARKER"


def live_descendants() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
            continue
    return found


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError):
            # (FileNotFoundError: psutil raises it when /proc/PID/stat goes while /proc/PID is still there,
            # a process exiting as we read it)
            continue
    return found


@pytest.fixture(autouse=True)
def private_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test its own V-IPU state and device locks (the embedded service keeps them under XDG_STATE_HOME)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def no_leaked_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Fail the test if anything it started is still running (after a bounded wait)."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    before = {proc.pid for proc in live_descendants()}
    yield marker
    leftovers = marked_processes(marker)
    leftovers += [proc for proc in live_descendants() if proc.pid not in before and proc not in leftovers]
    if not leftovers:
        return
    _, alive = psutil.wait_procs(leftovers, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running: {[(p.pid, p.cmdline()) for p in alive]}"


# -- nodeA and nodeB: a real OpenSSH server on 127.0.0.2 and 127.0.0.3 (tests/infra/sshd.py) --------------
@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no OpenSSH server here: {reason} (scripts/test.sh installs it when run as root)")
    with SshServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def home(sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME whose ~/.ssh/config names the two hosts nodeA and nodeB, as users set them up; after the test, no
    session, agent or instance may be left on either host (bounded wait, then fail)."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    shutil.copy(sshd.client_key, ssh / "id_ed25519")
    shutil.copy(sshd.known_hosts, ssh / "known_hosts")
    write_config(ssh, sshd, {"nodeA": "127.0.0.2", "nodeB": "127.0.0.3"})
    monkeypatch.setenv("HOME", str(ssh.parent))
    yield ssh.parent
    left = wait_gone([p for p in sshd.session_processes() if p.pid != sshd.process.pid], timeout=15)
    for proc in left:
        proc.kill()
    assert not left, f"left running on the hosts: {[(p.pid, p.cmdline()) for p in left]}"
