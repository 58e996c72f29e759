"""A live status line on a terminal: instances started / running / exited.

Shown only when stderr is a terminal (Graphcore's poprun showed interactive
progress); it is erased before any instance output or log line reaches the
terminal and drawn again after, so it never mixes into a line.
"""

from __future__ import annotations

import logging
import os

_ERASE = b"\r\x1b[K"


class StatusLine:
    """Counts instances through their life and keeps one line up to date."""

    def __init__(self, num_instances: int, fd: int = 2, enabled: bool | None = None) -> None:
        self._fd = fd
        self.enabled = os.isatty(fd) if enabled is None else enabled
        self._total = num_instances
        self._started = self._exited = self._failed = 0
        self._shown = False

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
        return f"poprun: {self._started}/{self._total} started, {running} running, {self._exited} exited{failed}"

    def show(self) -> None:
        if self.enabled:
            self._write(_ERASE + self.text().encode())
            self._shown = True

    def hide(self) -> None:
        if self._shown:
            self._write(_ERASE)
            self._shown = False

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._fd, data)
        except OSError:
            self.enabled = self._shown = False

    def log_filter(self) -> logging.Filter:
        """A filter for the launcher's log handler: erase the line before a log record."""
        status = self

        class _Erase(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                status.hide()
                return True

        return _Erase()
