"""Byte channels to an agent: an SSH channel (Paramiko) or a child's pipes (srun, or a local agent).

Both give the same small interface, so ``remote.AgentExecutor`` does not
know how its agent was reached. The agent's stderr is read alongside its
frames (never left to fill a buffer), relayed to the launcher's log line by
line and kept as a tail for error messages.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import threading
from typing import TYPE_CHECKING, Protocol

from .polling import readable

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("poprun.agent")
READ_SIZE = 1 << 18
STDERR_TAIL_LINES = 20


class AgentChannel(Protocol):
    def send(self, data: bytes) -> None: ...
    def read(self, timeout: float | None = None) -> bytes: ...
    def stderr_tail(self) -> tuple[str, ...]: ...
    def exit_status(self, timeout: float) -> int | None: ...
    def close(self) -> None: ...


class HostUnresponsive(ConnectionError):
    """The host stopped answering: the connection was closed on purpose, the message says why."""


class AgentStderr:
    """The agent's stderr: each line to the log (prefixed with the host), the last few kept."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._partial = b""
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            self._relay(line)

    def finish(self) -> None:
        if self._partial:
            self._relay(self._partial)
            self._partial = b""

    def _relay(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if text:
            self.tail.append(text)
            log.debug("%s: %s", self._host, text)


class SshChannel:
    """An agent at the other end of a Paramiko session channel."""

    def __init__(self, channel: paramiko.Channel, host: str) -> None:
        self._channel = channel
        self._fileno = channel.fileno()  # readable when stdout or stderr has data, or at EOF
        self._stderr = AgentStderr(host)
        self._send_lock = threading.Lock()  # frames from several threads must not interleave
        self._lost: str | None = None

    def send(self, data: bytes) -> None:
        if self._lost is not None:
            raise HostUnresponsive(self._lost)
        with self._send_lock:
            self._channel.sendall(data)

    def try_send(self, data: bytes) -> bool:
        """Send a small frame only if that cannot block (another send in progress, or no window left)."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            if self._channel.closed or not self._channel.send_ready():
                return False
            self._channel.sendall(data)
            return True
        except (OSError, EOFError):
            return False
        finally:
            self._send_lock.release()

    def mark_lost(self, reason: str) -> None:
        """Say why the connection is about to be closed: the end of this channel then raises it."""
        self._lost = reason

    def read(self, timeout: float | None = None) -> bytes:
        while True:
            if self._channel.recv_stderr_ready():
                self._stderr.feed(self._channel.recv_stderr(READ_SIZE))
                continue
            if self._channel.recv_ready() or self._channel.eof_received or self._channel.closed:
                data = self._channel.recv(READ_SIZE)
                if not data:
                    self._drain_stderr()
                    if self._lost is not None:
                        raise HostUnresponsive(self._lost)
                return data
            if not readable([self._fileno], timeout):
                raise TimeoutError
            # paramiko's pipe stays readable until the buffers are drained; the checks above drain them

    def _drain_stderr(self) -> None:
        while self._channel.recv_stderr_ready():
            self._stderr.feed(self._channel.recv_stderr(READ_SIZE))
        self._stderr.finish()

    def stderr_tail(self) -> tuple[str, ...]:
        return tuple(self._stderr.tail)

    def exit_status(self, timeout: float) -> int | None:
        """Only after EOF (paramiko's exit-status wait before draining output is a known deadlock)."""
        if self._channel.status_event.wait(timeout):
            return self._channel.recv_exit_status()
        return None

    def close(self) -> None:
        self._channel.close()


class PipeChannel:
    """An agent run as a child process of the launcher (by srun, or directly for tests)."""

    def __init__(self, process: subprocess.Popen, host: str) -> None:
        assert process.stdin and process.stdout and process.stderr
        self._process = process
        self._out = process.stdout.fileno()
        self._err: int | None = process.stderr.fileno()
        self._stderr = AgentStderr(host)

    def send(self, data: bytes) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def read(self, timeout: float | None = None) -> bytes:
        while True:
            fds = [self._out] + ([self._err] if self._err is not None else [])
            ready = readable(fds, timeout)
            if not ready:
                raise TimeoutError
            if self._err in ready:
                data = os.read(self._err, READ_SIZE)
                if data:
                    self._stderr.feed(data)
                else:
                    self._stderr.finish()
                    self._err = None
            if self._out in ready:
                data = os.read(self._out, READ_SIZE)
                if not data:
                    self._drain_stderr()
                return data

    def _drain_stderr(self) -> None:
        while self._err is not None and readable([self._err], 1.0):
            data = os.read(self._err, READ_SIZE)
            if not data:
                break
            self._stderr.feed(data)
        self._stderr.finish()
        self._err = None

    def stderr_tail(self) -> tuple[str, ...]:
        return tuple(self._stderr.tail)

    def exit_status(self, timeout: float) -> int | None:
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Closing stdin tells the agent to stop its instances; it is then reaped (bounded)."""
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self._process.wait(10.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
