"""Noticing that poprun's console went away, even while the instances print nothing.

``poprun ... | head -1``: once ``head`` exits, the next write to stdout fails
with EPIPE, but a job whose instances are silent would never write again
and would run until killed. So a thread polls poprun's stdout and stderr for
POLLERR/POLLHUP, which Linux reports on a pipe's write end once it has no
reader and on a terminal once it hangs up (poll(2) reports both even when
not asked for). A regular file or /dev/null never reports them, so a console
made only of those (a benchmark's, a batch job's) gets no thread at all.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import sys
import threading
from typing import Callable, Mapping

from .events import Stream

log = logging.getLogger("poprun.console")

_GONE = select.POLLERR | select.POLLHUP


class ConsoleWatch:
    """Calls ``on_closed(stream)`` once for each console stream whose reader goes away; ``close`` stops it."""

    def __init__(self, on_closed: Callable[[Stream], None],
                 fds: Mapping[Stream, int] = {"stdout": 1, "stderr": 2}) -> None:
        self._on_closed = on_closed
        self._poll = select.poll()
        self._streams: dict[int, list[Stream]] = {}
        for stream, fd in fds.items():
            if _may_lose_its_reader(fd):
                self._streams.setdefault(fd, []).append(stream)
        self._thread: threading.Thread | None = None
        if not self._streams:
            return
        self._wake_read, self._wake_write = os.pipe()
        for fd in self._streams:
            self._poll.register(fd, 0)  # no events asked for: only POLLERR/POLLHUP/POLLNVAL come back
        self._poll.register(self._wake_read, select.POLLIN)
        self._thread = threading.Thread(target=self._watch, name="poprun-console-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while self._streams:
            for fd, events in self._poll.poll():
                if fd == self._wake_read:
                    return
                self._poll.unregister(fd)  # reported once; it would report again at once
                for stream in self._streams.pop(fd, []):
                    if events & _GONE:
                        self._on_closed(stream)

    def close(self) -> None:
        if self._thread is None:
            return
        try:
            os.write(self._wake_write, b"x")
        except OSError:
            pass
        self._thread.join()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def __enter__(self) -> ConsoleWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _may_lose_its_reader(fd: int) -> bool:
    """A pipe, a socket or a terminal: what can report POLLERR/POLLHUP (not open: nothing to watch)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe without a reader, or a hung-up terminal, right now (no waiting)."""
    poll = select.poll()
    poll.register(fd, 0)
    return any(events & _GONE for _, events in poll.poll(0))


def stdout_lost_its_reader() -> bool:
    """After the parser exited 1 printing --help or --version: was it a closed pipe?

    Click leaves the broken pipe as it is; rich (typer's help) first points
    fd 1 at /dev/null, which ``--help`` output never meets otherwise, as an
    exit 1 needs an error.
    """
    try:
        return reader_gone(1) or os.path.samestat(os.fstat(1), os.stat(os.devnull))
    except OSError:
        return False


def log_to_open_stream(closed: Stream) -> None:
    """poprun's stderr went away: its log lines (this one and the summary) go to stdout instead."""
    if closed != "stderr":
        return
    for handler in logging.getLogger("poprun").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            handler.setStream(sys.stdout)


def say(*lines: str) -> None:
    """poprun's own lines for the user (errors, ``interrupted``) on stderr.

    A stderr that cannot take them (a full disk, a reader gone) changes nothing: the exit code still says
    what happened, and an exception here would replace it with exit 1 and a traceback nobody sees.
    """
    try:
        sys.stderr.write("".join(f"{line}\n" for line in lines))
        sys.stderr.flush()
    except OSError:
        pass


def quiet_closed_streams() -> None:
    """Before exit: a stream whose reader left gets /dev/null, so flushing it at exit raises nothing.

    (Python's documented way to exit quietly on a broken pipe: otherwise the
    interpreter reports the flush error and exits 120 instead of our code.)
    """
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, stream.fileno())
            finally:
                os.close(devnull)
