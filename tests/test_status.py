"""The live status line: on a terminal only, and never inside an output line."""

from __future__ import annotations

import re
import sys

import pytest

from screen import Screen
from support import OnTerminal, program, run_on_terminal

STATUS = re.compile(r"poprun: 1/1 started, \d running, \d exited, \d+:\d\d elapsed")


def python_executable() -> str:
    return sys.executable


def test_status_line_on_a_terminal_is_erased_around_output() -> None:
    screen = run_on_terminal("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "echo", "hello")
    assert b"poprun: 2/2 started" in screen
    assert b"2 exited" in screen
    for line in screen.replace(b"\r\n", b"\n").split(b"\n"):
        # what remains visible of each line after the terminal handles \r and erase-line
        visible = line.split(b"\x1b[K")[-1].split(b"\r")[-1]
        assert visible in (b"hello", b""), line


def test_a_progress_bar_stays_visible_under_the_status_line_with_its_elapsed_time() -> None:
    """A ``\\r`` bar is never drawn over: the status line goes on the line below it, with the time so far."""
    stream = run_on_terminal("--offline-mode", python_executable(), program("progress_bar.py"))
    both_seen: list[list[str]] = []

    def look(screen: Screen) -> None:
        lines = screen.lines()
        bar = any(line.startswith("progress ") for line in lines)
        status = any(STATUS.fullmatch(line) for line in lines)
        if bar and status and not both_seen:
            both_seen.append(lines)

    screen = Screen()
    screen.feed(stream, after_each=look)
    assert both_seen, stream  # at some moment the bar and the status line were both on screen
    assert "progress 3/3 [###]" in screen.lines(), (screen.lines(), stream)  # the bar's last state stays
    assert not any(line.startswith("poprun:") for line in screen.lines())  # the status line is gone at the end


def test_the_screen_model_reads_the_old_way_of_drawing_as_overwriting_the_bar() -> None:
    """The model itself: a status line drawn with \\r ESC[K over a bar leaves no bar (what happened before)."""
    screen = Screen()
    screen.feed(b"progress 1/3\r" + b"\r\x1b[Kpoprun: 1/1 started, 0:00 elapsed" + b"\r\x1b[K")
    assert screen.lines()[0] == ""
    screen.feed(b"progress 2/3\r\n\x1b[Kpoprun: status\x1b[A\r")
    assert screen.lines()[:2] == ["progress 2/3", "poprun: status"]


def test_elapsed_time_reads_like_a_stopwatch() -> None:
    from poprun_py.status import format_elapsed

    assert [format_elapsed(s) for s in (0, 7.9, 723, 3723)] == ["0:00", "0:07", "12:03", "1:02:03"]


def test_a_log_line_under_a_bar_starts_on_its_own_line() -> None:
    """What the terminal shows: the bar, then the log line below it, then the status line again."""
    import logging
    import os

    from poprun_py.status import StatusLine

    read_end, write_end = os.pipe()
    try:
        now = [100.0]
        status = StatusLine(1, fd=write_end, enabled=True, clock=lambda: now[0])
        status.started()
        status.hide()  # the job's loop, before it hands output to the router
        os.write(write_end, b"progress 1/3\r")  # as the router would
        status.console_wrote("stderr", b"progress 1/3\r")  # (stdout counts only when it is this terminal)
        now[0] += 5
        status.show()
        log_filter = status.log_filter()
        log_filter.filter(logging.LogRecord("poprun", logging.WARNING, __file__, 1, "x", None, None))
        os.write(write_end, b"POPRUN [W] something\n")
        status.show()
        screen = Screen()
        screen.feed(os.read(read_end, 65536))
    finally:
        os.close(read_end)
        os.close(write_end)
    assert screen.lines()[:3] == ["progress 1/3", "POPRUN [W] something",
                                  "poprun: 1/1 started, 1 running, 0 exited, 0:05 elapsed"]


def test_the_elapsed_time_moves_while_nothing_else_happens(tmp_path) -> None:
    """The clock is redrawn on its own while the program waits (on a FIFO) with nothing to say.

    The test lets the program go once three different times were drawn after its line: a whole
    second has passed since it printed, so it is blocked in open() by then.
    """
    import os

    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    waiter = f"print('waiting', flush=True); open({str(fifo)!r}).read()"

    def times_after_waiting(seen: bytes) -> set[bytes]:
        _, found, after = seen.partition(b"waiting")
        return set(re.findall(rb"(\d+:\d\d) elapsed", after)) if found else set()

    with OnTerminal("--offline-mode", sys.executable, "-c", waiter) as terminal:
        assert terminal.read_until(lambda seen: len(times_after_waiting(seen)) >= 3), terminal.seen
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the program end (fails, never hangs)
        assert terminal.finish() == 0
    screen = Screen()
    screen.feed(terminal.seen)
    assert "waiting" in screen.lines()


@pytest.mark.parametrize("columns", [20, 40])
def test_the_status_line_is_cut_to_the_terminals_width(columns: int) -> None:
    """A status line wider than the terminal wraps, and erasing it then leaves its first row behind at every
    redraw: it is cut to one character less than the width."""
    stream = run_on_terminal("--offline-mode", "--num-instances", "2", "--num-replicas", "2", "echo", "hello",
                             columns=columns)
    drawn = re.findall(rb"poprun: [^\r\n\x1b]*", stream)
    assert drawn and all(len(line) == columns - 1 for line in drawn), stream  # (every one is wider uncut)


@pytest.mark.parametrize("term", ["dumb", None], ids=["TERM=dumb", "no TERM"])
def test_no_status_line_where_the_terminal_takes_no_cursor_control(term: str | None) -> None:
    """Emacs' shell and compile buffers, CI log viewers with a pty: escape sequences there are noise."""
    stream = run_on_terminal("--offline-mode", "--num-instances", "2", "--num-replicas", "2", "echo", "hello",
                             term=term)
    assert stream == b"hello\r\nhello\r\n", stream


def test_ctrl_z_erases_the_status_line_before_poprun_stops_and_it_comes_back_on_sigcont(tmp_path) -> None:
    """Before, poprun stopped with its line on screen, and the shell's "Stopped" came under it.

    The instances (in sessions of their own) are not stopped: they end once poprun is continued.
    """
    import os
    import signal

    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    waiter = f"go = open({str(fifo)!r}); print('waiting', flush=True); go.read(); print('done', flush=True)"
    drawn_after_both = re.compile(rb"waiting.*waiting.*\x1b\[Kpoprun: 2/2 started", re.DOTALL)
    release = os.open(fifo, os.O_RDWR)  # its one writer: the instances open it at once, read until it is closed
    try:
        with OnTerminal("--offline-mode", "--num-instances", "2", "--num-replicas", "2", sys.executable, "-c",
                        waiter) as terminal:
            pid = terminal.process.pid
            assert terminal.read_until(lambda seen: drawn_after_both.search(seen) is not None), terminal.seen
            os.kill(pid, signal.SIGTSTP)
            stopped = terminal.read_until_stopped()
            assert stopped is not None and stopped.si_code == os.CLD_STOPPED, stopped
            at_stop = terminal.written_so_far()
            screen = Screen()
            screen.feed(at_stop)
            assert screen.lines()[:3] == ["waiting", "waiting", ""], at_stop
            os.kill(pid, signal.SIGCONT)
            assert terminal.read_until(lambda seen: b"\x1b[Kpoprun: 2/2 started" in seen[len(at_stop):]), \
                terminal.seen
            os.close(release)  # the instances read the FIFO's end, and end
            release = -1
            assert terminal.finish() == 0, terminal.seen
    finally:
        if release >= 0:
            os.close(release)
    screen.feed(terminal.seen[len(at_stop):])
    assert screen.lines()[:4] == ["waiting", "waiting", "done", "done"], terminal.seen

