"""Helpers for tests that run poprun as users do: a real process, bounded in time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

PROGRAMS = Path(__file__).parent / "programs"
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


def read_line(stream, timeout: float = RUN_TIMEOUT) -> bytes:
    """The next line of a process's output pipe, failing after ``timeout`` seconds (b"" once it closes).

    A test that waits on a program's output must not wait forever if the program hangs.
    """
    import time

    from simipu.vipu.testing import read_line as read_line_by

    return read_line_by(stream, time.monotonic() + timeout)
