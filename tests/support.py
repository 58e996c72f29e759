"""Helpers for tests that run poprun as users do: a real process, bounded in time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import psutil

PROGRAMS = Path(__file__).parent / "programs"
EXAMPLES = Path(__file__).parent.parent / "examples"
#: Upper bound for any single poprun run in the tests.
RUN_TIMEOUT = 60


def poprun_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "poprun_py", *args]


def run_poprun(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None,
               timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
    """Run poprun to completion, bounded in time, capturing bytes."""
    return subprocess.run(poprun_command(*args), capture_output=True, cwd=cwd, env=env, timeout=timeout)


def program(name: str) -> str:
    return str(PROGRAMS / name)


def python_program(name: str, *args: str) -> Sequence[str]:
    return (sys.executable, program(name), *args)


def run_on_terminal(*args: str, timeout: float = RUN_TIMEOUT) -> bytes:
    """Run poprun with stdout and stderr on a pseudo-terminal; return all it wrote there (bounded in time)."""
    import select
    import time

    controller, terminal = os.openpty()
    process = subprocess.Popen(poprun_command(*args), stdout=terminal, stderr=terminal, stdin=subprocess.DEVNULL)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while select.select([controller], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert process.wait(max(1.0, deadline - time.monotonic())) == 0, b"".join(chunks)
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait()
    return b"".join(chunks)


def python_example(name: str, *args: str) -> Sequence[str]:
    """An example program of examples/, run with this interpreter."""
    return (sys.executable, str(EXAMPLES / name), *args)


def read_line(stream, timeout: float = RUN_TIMEOUT) -> bytes:
    """The next line of a process's output pipe, failing after ``timeout`` seconds (b"" once it closes).

    A test that waits on a program's output must not wait forever if the program hangs.
    """
    import time

    from simipu.vipu.testing import read_line as read_line_by

    return read_line_by(stream, time.monotonic() + timeout)


class Launch:
    """A poprun in the background whose output the test reads line by line."""

    def __init__(self, *args: str, env: dict | None = None, argv: Sequence[str] | None = None) -> None:
        """poprun with ``args``, or ``argv`` as given (poprun wrapped in salloc, say)."""
        command = list(argv) if argv is not None else poprun_command(*args)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.stderr = b""
        self._stderr_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_thread.start()

    def _read_stderr(self) -> None:
        self.stderr = self.process.stderr.read()

    def wait_for_lines(self, prefix: bytes, count: int) -> list[bytes]:
        found = []
        while len(found) < count:
            line = read_line(self.process.stdout)
            assert line, f"poprun ended before {count} lines starting with {prefix!r}: {self.finish()}"
            if line.startswith(prefix):
                found.append(line)
        return found

    def finish(self, timeout: float = RUN_TIMEOUT) -> int:
        code = self.process.wait(timeout)
        self._stderr_thread.join(timeout)
        self.process.stdout.close()
        return code


def pids_of(ready_lines: list[bytes]) -> list[int]:
    return [int(line.split()[2]) for line in ready_lines]


def assert_all_gone(pids: list[int]) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    assert not alive, [p.pid for p in alive]


def skip_without_ipv6_loopback() -> None:
    """Skip the test where ``::1`` cannot be bound (a kernel or container without IPv6)."""
    import socket

    import pytest

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
