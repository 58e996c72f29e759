"""An instance's side of the rendezvous: check in, wait for the peers, keep the line open."""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import threading
import time
from typing import Any

from ..errors import PeerLostError, RendezvousError, RendezvousTimeout
from .addresses import host_port
from .membership import Membership, Peer
from .messages import HEARTBEAT_INTERVAL, LAUNCHER, LEAVE_REASONS, FrameReader, challenge_answer, encode_frame

#: Seconds an instance waits for the rendezvous beyond the start-up timeout. The rendezvous counts that timeout
#: from the first check-in, which comes after this side has connected, and then names the missing instances; this
#: side's own bound only ends a wait on a rendezvous that stopped answering, so it must never come first (with
#: --startup-timeout 0.001 it did: an instance gave up before its check-in was answered, exit 1, not 79).
RENDEZVOUS_GRACE = 5.0


class ControlChannel:
    """An instance's open line to the rendezvous: heartbeats out, loss and leave notices in.

    Every new loss writes a byte to a pipe whose read end is ``wake_fd``, so a
    wait can poll it beside its sockets; a waiter calls ``clear_wake`` before
    reading ``lost()``, so each later loss wakes it again. Not thread-safe
    beyond that: one thread waits on it (the fabric's), one reads the socket.
    """

    def __init__(self, sock: socket.socket, reader: FrameReader, beat_every: float = HEARTBEAT_INTERVAL) -> None:
        self._sock = sock
        self._beat_every = beat_every
        self._reader = reader
        self._lost: dict[int, str] = {}
        self._left: dict[int, str] = {}  # instances that said goodbye, and why (``LEAVE_REASONS``' words)
        self._lock = threading.Lock()
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.wake_fd = self._wake_r
        self._thread = threading.Thread(target=self._run, name="poprun-fabric-control", daemon=True)
        self._thread.start()

    def lost(self) -> dict[int, str]:
        with self._lock:
            return dict(self._lost)

    def left(self) -> dict[int, str]:
        """The instances that left the fabric cleanly, and why: what a peer still waiting for one reports."""
        with self._lock:
            return dict(self._left)

    def raise_if_lost(self, among: set[int] | None = None) -> None:
        """Raise PeerLostError for the first lost instance (of ``among``, if given). Clears the wake fd."""
        self.clear_wake()
        for instance, reason in sorted(self.lost().items()):
            if instance == LAUNCHER or among is None or instance in among:
                raise PeerLostError(instance, reason)

    def clear_wake(self) -> None:
        """Empty the wake pipe; call it before reading ``lost()`` so that the next loss wakes ``wake_fd`` again."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _mark_lost(self, instance: int, reason: str) -> None:
        self._mark(self._lost, instance, reason)

    def _mark(self, table: dict[int, str], instance: int, reason: str) -> None:
        with self._lock:
            new = instance not in table
            table.setdefault(instance, reason)
            if new and not self._closing:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:
                    pass  # the pipe is full of unread wake-ups: readable already

    def _handle(self, message: dict[str, Any]) -> None:
        if "lost" in message:
            self._mark_lost(int(message["lost"]), str(message.get("reason", "")))
        elif "left" in message:
            why = LEAVE_REASONS.get(str(message.get("why")), LEAVE_REASONS["closed"])
            self._mark(self._left, int(message["left"]), why)

    def _run(self) -> None:
        while (message := self._reader.pop()) is not None:  # frames that came with the peer table
            self._handle(message)
        next_beat = time.monotonic() + self._beat_every
        poller = select.poll()  # not select(): this socket's number may be above FD_SETSIZE (1024)
        poller.register(self._sock, select.POLLIN)
        while not self._closing:
            timeout = max(0.0, next_beat - time.monotonic())
            try:
                if poller.poll(timeout * 1000):
                    data = self._sock.recv(65536)
                    if not data:
                        raise ConnectionResetError("the rendezvous closed the connection")
                    for message in self._reader.feed(data):
                        self._handle(message)
                if time.monotonic() >= next_beat:
                    with self._lock:
                        if not self._closing:
                            self._sock.sendall(encode_frame({"hb": 1}))
                    next_beat = time.monotonic() + self._beat_every
            except (OSError, ValueError) as exc:
                if not self._closing:
                    self._mark_lost(LAUNCHER, f"the launcher's rendezvous is unreachable ({exc})")
                return

    def close(self, why: str = "closed") -> None:
        """Leave cleanly: the others are told this instance left, and ``why`` (a ``LEAVE_REASONS`` key), not
        that it was lost."""
        self._leave(say_bye=True, why=why)

    def abandon(self) -> None:
        """Leave without a goodbye: the rendezvous declares this instance lost and tells every other at once.

        For an instance that cannot take part after all (its data mesh could
        not be built): its peers stop waiting for it now, not at a timeout.
        """
        self._leave(say_bye=False)

    def _leave(self, say_bye: bool, why: str = "closed") -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if say_bye:
                try:
                    self._sock.sendall(encode_frame({"bye": 1, "why": why}))
                except OSError:
                    pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def join(
    address: tuple[str, int],
    token: bytes,
    me: Peer,
    num_instances: int,
    *,
    job_id: str,
    timeout: float,
    beat_every: float = HEARTBEAT_INTERVAL,
) -> tuple[Membership, ControlChannel]:
    """Check in, wait for every peer, and keep the line open (a heartbeat every ``beat_every`` seconds).

    ``timeout`` is the rendezvous's start-up timeout: it says when peers are missing, naming them
    (``RendezvousTimeout``); this side gives up on its own only ``RENDEZVOUS_GRACE`` seconds later.
    """
    bound = timeout + RENDEZVOUS_GRACE
    deadline = time.monotonic() + bound
    try:
        sock = socket.create_connection(address, timeout=bound)
    except OSError as exc:
        raise RendezvousError(f"cannot reach the job's rendezvous at {host_port(*address)}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = FrameReader()
    try:
        hello = _receive(sock, reader, deadline)
        nonce = bytes.fromhex(str(hello.get("nonce", "")))
        sock.sendall(encode_frame({
            "auth": challenge_answer(token, nonce),
            "peer": dataclasses.asdict(me),
            "num_instances": num_instances,
        }))
        while True:
            message = _receive(sock, reader, deadline)
            if "peers" in message:
                peers = _peer_table(message["peers"])
                sock.settimeout(None)
                return Membership(job_id, me.instance, peers), ControlChannel(sock, reader, beat_every)
            if "error" in message:
                missing = tuple(message.get("missing", ()))
                if missing:
                    raise RendezvousTimeout(str(message["error"]), missing)
                raise RendezvousError(str(message["error"]))
            if "lost" in message:
                raise PeerLostError(int(message["lost"]), f"during start-up: {message.get('reason', '')}")
    except BaseException:
        sock.close()
        raise


def _receive(sock: socket.socket, reader: FrameReader, deadline: float) -> dict[str, Any]:
    while (message := reader.pop()) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError("timed out waiting for the job's rendezvous")
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise RendezvousError("timed out waiting for the job's rendezvous") from None
        if not data:
            raise RendezvousError("the job's rendezvous closed the connection")
        reader.add(data)
    return message



def _peer_table(entries: Any) -> tuple[Peer, ...]:
    try:
        return tuple(Peer.from_wire(entry) for entry in entries)
    except (TypeError, ValueError) as exc:
        raise RendezvousError(f"the job's rendezvous sent a malformed peer table ({exc})") from None
