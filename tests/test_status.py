"""The live status line: on a terminal only, and never inside an output line."""

from __future__ import annotations

import os
import subprocess

from support import RUN_TIMEOUT, poprun_command


def run_on_terminal(*args: str) -> bytes:
    """Run poprun with stdout and stderr on a pseudo-terminal; return all it wrote there."""
    controller, terminal = os.openpty()
    process = subprocess.Popen(poprun_command(*args), stdout=terminal, stderr=terminal, stdin=subprocess.DEVNULL)
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    assert process.wait(RUN_TIMEOUT) == 0
    return b"".join(chunks)


def test_status_line_on_a_terminal_is_erased_around_output() -> None:
    screen = run_on_terminal("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "echo", "hello")
    assert b"poprun: 2/2 started" in screen
    assert b"2 exited" in screen
    for line in screen.replace(b"\r\n", b"\n").split(b"\n"):
        # what remains visible of each line after the terminal handles \r and erase-line
        visible = line.split(b"\x1b[K")[-1].split(b"\r")[-1]
        assert visible in (b"hello", b""), line
