"""The job's rendezvous: instances check in, learn their peers, and hear of losses.

The launcher binds the listening socket itself (port 0, kept open, so there
is no pick-then-bind race) and passes its address down. Every connection
proves it knows the job's secret by answering a challenge (HMAC-SHA256 over a
fresh nonce): the secret itself never crosses the wire, and a connection that
cannot answer is refused and logged, so two jobs on one host never mix.

Start-up is one stage with its own deadline: once the first instance has
checked in, the others have ``checkin_timeout`` seconds; on expiry every
waiting instance gets an error naming the missing ones. (A program that never
uses the fabric never checks in, and then nothing times out.)

After start-up the connection stays open as a control channel: an instance
whose connection closes without a clean leave, or that misses heartbeats for
``heartbeat_timeout`` seconds, is declared lost and every other instance is
told, so no collective waits forever on a peer that is gone.

Frames are a 4-byte big-endian length and a JSON object: never pickle.
"""

from __future__ import annotations

import hmac
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .frames import HEARTBEAT_INTERVAL, FrameReader, challenge_answer, encode_frame
from .member import ControlChannel, join

__all__ = ["ControlChannel", "RendezvousServer", "join"]

log = logging.getLogger("poprun.rendezvous")


def _format_indices(indices: tuple[int, ...]) -> str:
    return ", ".join(map(str, indices))


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    address: str
    nonce: bytes
    reader: FrameReader = field(default_factory=FrameReader)
    instance: int | None = None
    last_seen: float = field(default_factory=time.monotonic)
    left: bool = False


class RendezvousServer:
    """Runs in the launcher: one thread, one selector, every instance's control connection."""

    def __init__(
        self,
        num_instances: int,
        token: bytes,
        *,
        bind_host: str = "127.0.0.1",
        checkin_timeout: float = 60.0,
        heartbeat_timeout: float = 10.0,
        on_timeout: Callable[[tuple[int, ...], str], None] | None = None,
    ) -> None:
        self._num_instances = num_instances
        self._token = token
        self._checkin_timeout = checkin_timeout
        self._heartbeat_timeout = heartbeat_timeout
        self._on_timeout = on_timeout
        self._listener = socket.create_server((bind_host, 0), backlog=max(128, num_instances))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._connections: set[_Connection] = set()
        self._checked_in: dict[int, _Connection] = {}
        self._peers: dict[int, dict[str, Any]] = {}
        self._lost: dict[int, str] = {}
        self._checkin_deadline: float | None = None
        self._complete = False
        self._timed_out = False
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="poprun-rendezvous", daemon=True)

    def start(self) -> None:
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._thread.start()

    def close(self) -> None:
        """Stop serving; every member sees its control line close. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            os.write(self._stop_w, b"x")
            self._thread.join(5)
        for connection in list(self._connections):
            connection.sock.close()
        self._listener.close()
        self._selector.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    # -- the loop ------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select(self._next_timeout()):
                if key.data == "stop":
                    return
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            self._check_deadlines()

    def _next_timeout(self) -> float:
        now = time.monotonic()
        deadlines = [now + HEARTBEAT_INTERVAL]
        if self._checkin_deadline is not None:
            deadlines.append(self._checkin_deadline)
        return max(0.0, min(deadlines) - now)

    def _accept(self) -> None:
        try:
            sock, address = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock, f"{address[0]}:{address[1]}", os.urandom(32))
        self._connections.add(connection)
        self._selector.register(sock, selectors.EVENT_READ, connection)
        self._send(connection, {"nonce": connection.nonce.hex()})

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        connection.last_seen = time.monotonic()
        try:
            messages = connection.reader.feed(data)
        except ValueError as exc:
            self._refuse(connection, f"malformed frame: {exc}")
            return
        for message in messages:
            if connection.instance is None:
                self._check_in(connection, message)
                if connection.instance is None:
                    return
            elif message.get("bye"):
                connection.left = True

    def _check_in(self, connection: _Connection, message: dict[str, Any]) -> None:
        answer = str(message.get("auth", ""))
        if not hmac.compare_digest(answer, challenge_answer(self._token, connection.nonce)):
            self._refuse(connection, "it does not know this job's token")
            return
        try:
            peer = message["peer"]
            instance = int(peer["instance"])
            num_instances = int(message["num_instances"])
        except (KeyError, TypeError, ValueError):
            self._refuse(connection, "its check-in is malformed")
            return
        if num_instances != self._num_instances or not 0 <= instance < self._num_instances:
            self._refuse(connection, f"it claims instance {instance} of {num_instances}, but the job has {self._num_instances}")
            return
        if instance in self._checked_in or instance in self._lost:
            self._refuse(connection, f"instance {instance} has already checked in")
            return
        if self._timed_out:
            self._refuse(connection, f"instance {instance} checked in after the start-up deadline")
            return
        connection.instance = instance
        self._checked_in[instance] = connection
        self._peers[instance] = peer
        log.debug("instance %d checked in from %s", instance, connection.address)
        if self._checkin_deadline is None:
            self._checkin_deadline = time.monotonic() + self._checkin_timeout
        if len(self._checked_in) == self._num_instances:
            self._complete = True
            self._checkin_deadline = None
            table = [self._peers[i] for i in range(self._num_instances)]
            for other in self._checked_in.values():
                self._send(other, {"peers": table})
            log.debug("all %d instances checked in", self._num_instances)

    def _refuse(self, connection: _Connection, why: str) -> None:
        log.warning("refused a fabric connection from %s: %s", connection.address, why)
        self._send(connection, {"error": f"refused by the job's rendezvous: {why}"})
        self._forget(connection)

    def _drop(self, connection: _Connection) -> None:
        self._forget(connection)
        if connection.instance is not None and not connection.left:
            self._declare_lost(connection.instance, "its process exited or closed its fabric connection")

    def _forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()
        if connection.instance is not None and self._checked_in.get(connection.instance) is connection:
            del self._checked_in[connection.instance]

    def _declare_lost(self, instance: int, reason: str) -> None:
        if instance in self._lost:
            return
        self._lost[instance] = reason
        log.info("fabric: instance %d is lost: %s", instance, reason)
        for other in list(self._checked_in.values()):
            self._send(other, {"lost": instance, "reason": reason})

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if self._checkin_deadline is not None and now >= self._checkin_deadline:
            self._checkin_deadline = None
            self._timed_out = True
            missing = tuple(i for i in range(self._num_instances) if i not in self._peers)
            message = (
                f"instances {_format_indices(missing)} did not check in to the fabric within "
                f"{self._checkin_timeout:g} s of the first"
            )
            log.error("%s", message)
            for other in list(self._checked_in.values()):
                self._send(other, {"error": message, "missing": list(missing)})
            if self._on_timeout is not None:
                self._on_timeout(missing, message)
        for connection in list(self._checked_in.values()):
            if not connection.left and now - connection.last_seen > self._heartbeat_timeout:
                instance = connection.instance
                assert instance is not None
                self._forget(connection)
                self._declare_lost(instance, f"no heartbeat for {self._heartbeat_timeout:g} s: its host may be unreachable")

    def _send(self, connection: _Connection, message: dict[str, Any]) -> None:
        try:
            connection.sock.sendall(encode_frame(message))
        except OSError:
            pass  # its read side will see the loss
