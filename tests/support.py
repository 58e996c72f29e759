"""Helpers for tests that run poprun as users do: a real process, bounded in time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

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


class OnTerminal:
    """poprun with stdout and stderr on a pseudo-terminal, read as it writes, bounded in time.

    ``columns``: the terminal's width, set as a terminal emulator sets it (TIOCSWINSZ); by default the
    width is unknown (0). ``term``: the ``TERM`` poprun sees (None: unset). poprun gets a process group of
    its own, as a shell with job control gives each job: the job-control signals (SIGTSTP) stop it, which
    they never do to a process in an orphaned group.
    """

    def __init__(self, *args: str, columns: int | None = None, term: str | None = "xterm",
                 timeout: float = RUN_TIMEOUT) -> None:
        import time

        self.controller, self._terminal = os.openpty()
        if columns is not None:
            import fcntl
            import struct
            import termios

            fcntl.ioctl(self._terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        env = {name: value for name, value in os.environ.items() if name != "TERM"}
        if term is not None:
            env["TERM"] = term
        self.process = subprocess.Popen(poprun_command(*args), stdout=self._terminal, stderr=self._terminal,
                                        stdin=subprocess.DEVNULL, env=env, preexec_fn=os.setpgrp)
        self.seen = b""
        self.deadline = time.monotonic() + timeout

    def read_until(self, condition: Callable[[bytes], bool], every: float | None = None) -> bool:
        """Read until ``condition(all read so far)`` holds, poprun has closed the terminal, or time is up.

        ``every``: seconds after which to ask again with nothing read (a condition on more than the output).
        """
        import select
        import time

        while not condition(self.seen):
            left = self.deadline - time.monotonic()
            if left <= 0:
                return False
            if not select.select([self.controller], [], [], min(left, every or left))[0]:
                if every is None:
                    return False
                continue
            try:
                data = os.read(self.controller, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return False
            if not data:
                return False
            self.seen += data
        return True

    def read_until_stopped(self) -> os.waitid_result | None:
        """Read until poprun stops (a job-control signal) or exits: how, or None if neither came in time.

        (The state is left for ``Popen`` to collect.)
        """
        changed: list[os.waitid_result] = []

        def state_changed(_: bytes) -> bool:
            found = os.waitid(os.P_PID, self.process.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT | os.WNOHANG)
            changed.extend([found] if found is not None else [])
            return bool(changed)

        self.read_until(state_changed, every=0.01)
        return changed[0] if changed else None

    def written_so_far(self) -> bytes:
        """All poprun has written until now (it is stopped, say): a mark written after it comes out after it."""
        mark = b"<mark %d>" % len(self.seen)
        os.write(self._terminal, mark)
        assert self.read_until(lambda seen: mark in seen), self.seen
        before, _, after = self.seen.partition(mark)
        self.seen = before + after
        return before

    def finish(self) -> int:
        """Read to the end; poprun's exit code."""
        import time

        self._close_terminal()
        self.read_until(lambda _: False)
        return self.process.wait(max(1.0, self.deadline - time.monotonic()))

    def _close_terminal(self) -> None:
        if self._terminal >= 0:
            os.close(self._terminal)
            self._terminal = -1

    def __enter__(self) -> OnTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_terminal()
        os.close(self.controller)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_on_terminal(*args: str, timeout: float = RUN_TIMEOUT, columns: int | None = None,
                    term: str | None = "xterm") -> bytes:
    """Run poprun with stdout and stderr on a pseudo-terminal; return all it wrote there (bounded in time)."""
    with OnTerminal(*args, columns=columns, term=term, timeout=timeout) as terminal:
        code = terminal.finish()
        assert code == 0, terminal.seen
    return terminal.seen


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
        # (SIGINT at its default, as a terminal's foreground job has it, for the tests that press Ctrl-C: a
        # background job of a non-interactive shell, as CI may run the suite, inherits it ignored)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
