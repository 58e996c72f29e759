"""A live status line on a terminal: instances started / running / exited, and the time so far.

Shown only when stderr is a terminal that takes cursor control (``TERM`` set
and not ``dumb``: Emacs' shell and compile buffers, and CI log viewers that
give a job a pty, show the escape sequences as noise), as Graphcore's poprun
showed interactive progress. It is cut to the terminal's width on every draw
(a line that wrapped could not be erased: each redraw would leave one behind).
It must never hide what the program draws, so it follows where
the program left the cursor (the last byte instance output put on the
terminal):

* after a ``\\n`` (a fresh line), the status line is drawn there and erased
  before the next output or log line;
* after a ``\\r`` (a progress bar being redrawn in place), it is drawn on
  the line below and the cursor goes back up, so the bar stays visible and
  its next redraw lands where it should;
* after anything else (a line without its end), it is not drawn.

A log line while a bar is on screen starts on a line of its own, so the bar's
last state stays readable above it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable

_ERASE = b"\r\x1b[K"  # to column 0, erase the line
_DOWN_ERASE = b"\x1b[B\r\x1b[K"  # to the line below, erase it
_UP = b"\x1b[A\r"  # back up to column 0 of the line above


def format_elapsed(seconds: float) -> str:
    """``0:07``, ``12:03``, ``1:02:03``: as a stopwatch shows it."""
    whole = int(max(0.0, seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StatusLine:
    """Counts instances through their life and keeps one line up to date."""

    def __init__(self, num_instances: int, fd: int = 2, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fd = fd
        self.enabled = takes_cursor_control(fd) if enabled is None else enabled
        self._total = num_instances
        self._started = self._exited = self._failed = 0
        self._clock = clock
        self._since = clock()
        self._shown: str | None = None  # None, "here" (on the cursor's line) or "below" (under a bar)
        self._console_end = b"\n"  # the last byte output put on this terminal
        self._stdout_here = self.enabled and _same_terminal(1, fd)

    def started(self) -> None:
        self._started += 1
        self.show()

    def exited(self, failed: bool) -> None:
        self._exited += 1
        self._failed += int(failed)
        self.show()

    def text(self) -> str:
        running = self._started - self._exited
        failed = f", {self._failed} failed" if self._failed else ""
        elapsed = format_elapsed(self._clock() - self._since)
        return (f"poprun: {self._started}/{self._total} started, {running} running, "
                f"{self._exited} exited{failed}, {elapsed} elapsed")

    def console_wrote(self, stream: str, data: bytes) -> None:
        """Instance output reached the console (``OutputRouter``'s ``on_console``): note where it left the cursor."""
        if data and (stream == "stderr" or self._stdout_here):
            self._console_end = data[-1:]

    def show(self) -> None:
        if not self.enabled:
            return
        if self._console_end == b"\n":
            self._write(self._erasing() + _ERASE + self._fitted(), "here")
        elif self._console_end == b"\r":
            self._write(self._erasing() + b"\n\x1b[K" + self._fitted() + _UP, "below")
        else:
            self.hide()

    def _fitted(self) -> bytes:
        """The text, cut to one character less than the terminal's width (asked each time: it follows resizes).

        One less: a line that fills the last column leaves some terminals' cursor pending on the next row.
        A width the terminal does not know (0, or not a terminal) leaves the text whole.
        """
        text = self.text()
        try:
            columns = os.get_terminal_size(self._fd).columns
        except OSError:
            columns = 0
        return (text[:columns - 1] if columns > 0 else text).encode()

    def refresh(self) -> None:
        """Redraw with the time updated, if it is on screen."""
        if self._shown is not None:
            self.show()

    def seconds_to_next_tick(self) -> float | None:
        """When the elapsed time next changes on screen (None: nothing to redraw)."""
        if self._shown is None:
            return None
        return 1.0 - (self._clock() - self._since) % 1.0

    @property
    def on_screen(self) -> bool:
        """Whether the line is on screen, or being drawn: a Ctrl-Z now must erase it before poprun stops."""
        return self._shown is not None

    def suspend(self, signum: int) -> None:
        """Ctrl-Z (``signum``, SIGTSTP): erase the line, stop as the signal's default action does, and once
        continued (SIGCONT) draw it again; the signal's handler is put back as it was.

        The signal poprun sends itself is delivered to this thread as ``kill`` returns, so the process is
        stopped there and nothing runs between the erase before it and the stop.
        """
        shown = self.on_screen
        self.hide()
        handler = signal.signal(signum, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signum)
        finally:
            signal.signal(signum, handler)
        if shown:
            self.show()  # the line as it is now

    def hide(self) -> None:
        if self._shown is not None:
            self._write(self._erasing(), None)

    def _erasing(self) -> bytes:
        return {"here": _ERASE, "below": _DOWN_ERASE + _UP}.get(self._shown or "", b"")

    def _write(self, data: bytes, shown: str | None) -> None:
        if shown is not None:
            self._shown = shown  # on screen from its first byte on (``on_screen``)
        try:
            os.write(self._fd, data)
            self._shown = shown
        except OSError:
            self.enabled = False
            self._shown = None

    def _before_log_line(self) -> None:
        self.hide()
        if self.enabled and self._console_end != b"\n":
            self._write(b"\n", None)  # keep the bar (or the unfinished line) whole, above the log line
        self._console_end = b"\n"  # a log line ends with one

    def log_filter(self) -> logging.Filter:
        """A filter for the launcher's log handler: clear the way before a log record."""
        status = self

        class _Erase(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                status._before_log_line()
                return True

        return _Erase()


def takes_cursor_control(fd: int) -> bool:
    """Whether ``fd`` is a terminal that understands cursor control: ``TERM`` set, and not ``dumb``."""
    return os.isatty(fd) and os.environ.get("TERM", "dumb") not in ("", "dumb")


def _same_terminal(fd: int, other: int) -> bool:
    """Whether ``fd`` writes to the same terminal as ``other`` (instance stdout then moves its cursor)."""
    try:
        return os.isatty(fd) and os.fstat(fd).st_rdev == os.fstat(other).st_rdev
    except OSError:
        return False
