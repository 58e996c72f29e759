"""The launcher's side of the guardian (see ``guardian_process.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

log = logging.getLogger("poprun.guardian")

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guardian_process.py")


class Guardian:
    """Keeps a list of live process groups in a watchdog that outlives the launcher."""

    def __init__(self, grace: float) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", _SCRIPT, str(grace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        assert self._process.stdin is not None
        self._stdin = self._process.stdin

    def _send(self, line: str) -> None:
        try:
            self._stdin.write(line.encode() + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError):
            log.warning("the guardian process is gone; instances may survive if poprun is killed")

    def fileno(self) -> int:
        """The pipe whose end of input tells the guardian the launcher died: no instance may hold it."""
        return self._stdin.fileno()

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def release(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Normal end: the launcher has already stopped every group, so the guardian has
        nothing left to do; kill it rather than wait for its start-up to finish reading."""
        try:
            self._stdin.close()
        except BrokenPipeError:
            pass
        self._process.kill()
        self._process.wait()
