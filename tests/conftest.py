"""Shared test plumbing: bounded poprun runs and a leak check after every test.

Every process a test starts inherits ``POPRUN_TEST_MARKER=<unique id>`` from
the test's environment; after the test, no live process may carry it. A fork
keeps its parent's environment as it was at exec (``/proc/PID/environ``), so
the instances ``poprun_py.launch`` forks from the test process do not carry
it: they are caught as new descendants of the test process instead.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import psutil
import pytest

MARKER = "POPRUN_TEST_MARKER"


def live_descendants() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
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
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
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
