"""The live status line: on a terminal only, and never inside an output line."""

from __future__ import annotations

from support import run_on_terminal


def test_status_line_on_a_terminal_is_erased_around_output() -> None:
    screen = run_on_terminal("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "echo", "hello")
    assert b"poprun: 2/2 started" in screen
    assert b"2 exited" in screen
    for line in screen.replace(b"\r\n", b"\n").split(b"\n"):
        # what remains visible of each line after the terminal handles \r and erase-line
        visible = line.split(b"\x1b[K")[-1].split(b"\r")[-1]
        assert visible in (b"hello", b""), line
