"""The job's rendezvous: instances check in, learn their peers, and hear of losses.

The launcher binds the listening socket itself (port 0, kept open, so there
is no pick-then-bind race) and passes its address down. Every connection
proves it knows the job's secret by answering a challenge (HMAC-SHA256 over a
fresh nonce): the secret itself never crosses the wire, and a connection that
cannot answer is refused and logged (once per peer address), so two jobs on
one host never mix. Until it has answered, a connection is hostile input and
bounded as ``checkin`` says: small frames, a deadline of a few seconds, a cap
on how many may wait; whatever it sends costs only that connection, never the
rendezvous (which the whole job relies on to hear of losses).

Start-up is one stage with its own deadline: once the first instance has
checked in, the others have ``checkin_timeout`` seconds; on expiry every
waiting instance gets an error naming the missing ones. (A program that never
uses the fabric never checks in, and then nothing times out.) An instance
that exits without having checked in (the launcher says so:
``instance_exited``) fails start-up at once: the instances waiting in their
first collective, or arriving at it later, get an error naming it, instead
of waiting out the deadline for an instance that is gone. Heartbeats
count only from the end of start-up: an instance waiting for slow starters
(a program that imports torch or loads data before ``init()``) is not lost
for being quiet while it waits.

After start-up the connection stays open as a control channel: an instance
whose connection closes without a clean leave, or that misses heartbeats for
``heartbeat_timeout`` seconds, is declared lost and every other instance is
told, so no collective waits forever on a peer that is gone. Missed
heartbeats are not a loss when the launcher knows the instance's process on
its own host is alive and not stopped (``alive_here``): its exit would have
closed its connection, so it is busy, in a long call that holds Python's GIL
(a huge ``pickle.load``, big-integer arithmetic) and keeps its heartbeat
thread from running: a late peer, not a gone one.

Frames are a 4-byte big-endian length and a JSON object: never pickle.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .addresses import host_port, listen
from .checkin import CHECKIN_FRAME_DEADLINE, SPARE_PENDING, Refused, checkin_reader, parse_checkin
from .member import ControlChannel, join
from .messages import LEAVE_REASONS, FrameReader, encode_frame, heartbeat_interval

__all__ = ["ControlChannel", "RendezvousServer", "join"]

log = logging.getLogger("poprun.rendezvous")

#: accept() errors that mean "out of descriptors or memory": stop accepting for a moment, not for good.
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
#: Seconds the rendezvous stops accepting after running out of descriptors (connections wait in the backlog).
ACCEPT_PAUSE = 0.5
#: Connections taken from the backlog per wake-up: a flood cannot starve the instances' own connections.
_ACCEPTS_PER_WAKE = 32
#: Peer addresses remembered so that each one's refusals are logged once.
_REMEMBERED_REFUSALS = 1024
#: Seconds from the launcher seeing an instance exit without having checked in to the start-up failing for it:
#: a check-in it sent just before it exited (from another host, still on its way) arrives first.
EXIT_GRACE = 1.0


def _format_indices(indices: tuple[int, ...]) -> str:
    return ", ".join(map(str, indices))


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    host: str
    port: int
    nonce: bytes
    opened: float = field(default_factory=time.monotonic)
    reader: FrameReader = field(default_factory=checkin_reader)
    instance: int | None = None
    last_seen: float = field(default_factory=time.monotonic)
    left: bool = False

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)


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
        checkin_frame_deadline: float = CHECKIN_FRAME_DEADLINE,
        exit_grace: float = EXIT_GRACE,
        on_gone: Callable[[int], None] | None = None,
    ) -> None:
        self._num_instances = num_instances
        self._token = token
        self._checkin_timeout = checkin_timeout
        self._heartbeat_timeout = heartbeat_timeout
        self._on_timeout = on_timeout
        self._frame_deadline = checkin_frame_deadline
        self._exit_grace = exit_grace
        self._on_gone = on_gone
        self._max_pending = num_instances + SPARE_PENDING
        self._listener = listen(bind_host, max(128, num_instances))  # IPv4 or IPv6, as the host was reached
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._connections: set[_Connection] = set()
        self._pending: dict[_Connection, None] = {}  # not yet authenticated, oldest first
        self._checked_in: dict[int, _Connection] = {}
        self._peers: dict[int, dict[str, Any]] = {}
        self._lost: dict[int, str] = {}
        self._checkin_deadline: float | None = None
        self._accept_paused_until: float | None = None
        self._refused_hosts: set[str] = set()
        self._warned_out_of_fds = False
        self._complete = False
        self._timed_out = False
        #: Instances the launcher saw exit: (index, how, when), from its thread (``instance_exited``).
        self._exits: list[tuple[int, str, float]] = []
        #: Those that had not checked in: how and when they exited.
        self._gone: dict[int, tuple[str, float]] = {}
        #: Why start-up failed for an instance that exited (sent to every member that checks in).
        self._start_failure: str | None = None
        #: ``(instance) -> bool``, set by the launcher before ``start``: whether the instance's process is on the
        #: launcher's host, alive and not stopped (then missed heartbeats do not make it lost).
        self.alive_here: Callable[[int], bool] | None = None
        #: ``(instance) -> pid or None``, set with ``alive_here``: the pid of the instance's process if it is on
        #: the launcher's host and stopped (SIGSTOP, a debugger), so its loss is not blamed on its host.
        self.stopped_here: Callable[[int], int | None] | None = None
        self._busy_noted: set[int] = set()
        self._stop_r, self._stop_w = os.pipe()  # (a byte: look at ``_closed``, then at the exits)
        os.set_blocking(self._stop_w, False)  # (a full pipe wakes the loop as well as one more byte would)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="poprun-rendezvous", daemon=True)

    def start(self) -> None:
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._thread.start()

    def instance_exited(self, instance: int, how: str) -> None:
        """The launcher reaped ``instance``, which exited cleanly (``how``: ``"with code 0"``). If it never
        checked in, start-up fails for it (module docstring). Called from the launcher's thread."""
        if self._closed:
            return
        self._exits.append((instance, how, time.monotonic()))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._stop_w, b"w")
        except BlockingIOError:
            pass  # (full: the loop is woken already)

    def close(self) -> None:
        """Stop serving; every member sees its control line close. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._wake()
            self._thread.join(5)
        for connection in list(self._connections):
            connection.sock.close()
        self._listener.close()
        self._selector.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    # -- the loop ------------------------------------------------------------------
    def _serve(self) -> None:
        """The loop; a fault in handling one connection drops that connection, never the loop."""
        while True:
            for key, _ in self._selector.select(self._next_timeout()):
                if key.data == "stop":
                    os.read(self._stop_r, 4096)
                    if self._closed:
                        return
                    continue  # an exit: looked at with the deadlines
                if key.data is None:
                    self._accept()
                elif key.data in self._connections:  # (not one dropped earlier in this round)
                    self._guarded(self._read, key.data)
            try:
                self._check_deadlines()
            except Exception:
                log.exception("fabric: the rendezvous failed checking its deadlines (it goes on)")

    def _guarded(self, handle: Callable[[_Connection], None], connection: _Connection) -> None:
        try:
            handle(connection)
        except Exception:
            log.exception("fabric: dropped the connection from %s after an internal error", connection.address)
            self._drop(connection)

    def _next_timeout(self) -> float:
        now = time.monotonic()
        deadlines = [now + heartbeat_interval(self._heartbeat_timeout)]
        if self._checkin_deadline is not None:
            deadlines.append(self._checkin_deadline)
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        oldest = next(iter(self._pending), None)
        if oldest is not None:
            deadlines.append(oldest.opened + self._frame_deadline)
        if self._start_failure is None:  # an exit's grace still running (past it, the next check-in fails at once)
            deadlines += [when + self._exit_grace for _, when in self._gone.values() if when + self._exit_grace > now]
        return max(0.0, min(deadlines) - now)

    # -- new connections -----------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause_accepting(exc)
                    return
                continue  # that connection failed before we got it (ECONNABORTED and the like)
            try:
                self._admit(sock, address)
            except Exception:
                log.exception("fabric: could not take a connection from %s", address)
                sock.close()

    def _admit(self, sock: socket.socket, address: tuple[Any, ...]) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock, str(address[0]), int(address[1]), os.urandom(32))
        if len(self._pending) >= self._max_pending:  # a flood: the oldest waiter makes room
            oldest = next(iter(self._pending))
            self._refuse(oldest, f"more than {self._max_pending} connections were waiting to check in")
        self._connections.add(connection)
        self._pending[connection] = None
        self._selector.register(sock, selectors.EVENT_READ, connection)
        self._send(connection, {"nonce": connection.nonce.hex()})

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors: leave new connections in the backlog for a moment (a readable listener would spin)."""
        (log.debug if self._warned_out_of_fds else log.warning)(
            "fabric: the rendezvous cannot accept connections for now (%s); retrying in %g s",
            exc.strerror, ACCEPT_PAUSE)
        self._warned_out_of_fds = True
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE

    # -- traffic -------------------------------------------------------------------
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
                try:
                    self._check_in(connection, message)
                except Refused as refused:
                    self._refuse(connection, str(refused))
                    return
            elif message.get("bye") and not connection.left:
                self._relay_leave(connection, message.get("why"))

    def _check_in(self, connection: _Connection, message: dict[str, Any]) -> None:
        peer = parse_checkin(message, self._token, connection.nonce, self._num_instances).peer
        if peer.instance in self._checked_in or peer.instance in self._lost:
            raise Refused(f"instance {peer.instance} has already checked in")
        if self._timed_out:
            raise Refused(f"instance {peer.instance} checked in after the start-up deadline")
        del self._pending[connection]
        connection.instance = peer.instance
        self._checked_in[peer.instance] = connection
        self._peers[peer.instance] = asdict(peer)
        log.debug("instance %d checked in from %s", peer.instance, connection.address)
        if self._start_failure is not None:
            self._send(connection, {"error": self._start_failure})
            return
        if self._checkin_deadline is None:
            self._checkin_deadline = time.monotonic() + self._checkin_timeout
        if self._fail_start_for_the_gone(time.monotonic()):
            return
        if len(self._checked_in) == self._num_instances:
            self._complete = True
            self._checkin_deadline = None
            table = [self._peers[i] for i in range(self._num_instances)]
            now = time.monotonic()
            for other in self._checked_in.values():
                other.last_seen = now  # heartbeats count from here: waiting for slow starters is not silence
                self._send(other, {"peers": table})
            log.debug("all %d instances checked in", self._num_instances)

    def _relay_leave(self, connection: _Connection, why: object) -> None:
        """An instance said goodbye: tell the others, so that one still waiting for it says why it is gone
        (``why``, from an authenticated member, is still only ever one of ``LEAVE_REASONS``' codes)."""
        connection.left = True
        code = why if isinstance(why, str) and why in LEAVE_REASONS else "closed"
        if code == "exited" and self._on_gone is not None and connection.instance is not None:
            self._on_gone(connection.instance)  # its process is ending (in failure or not): first, as in ``_drop``
        for other in list(self._checked_in.values()):
            if other is not connection:
                self._send(other, {"left": connection.instance, "why": code})

    def _refuse(self, connection: _Connection, why: str) -> None:
        if connection.host in self._refused_hosts:
            log.debug("refused a fabric connection from %s: %s", connection.address, why)
        else:
            if len(self._refused_hosts) < _REMEMBERED_REFUSALS:
                self._refused_hosts.add(connection.host)
            log.warning("refused a fabric connection from %s: %s (further refusals of %s are logged at debug level)",
                        connection.address, why, connection.host)
        self._send(connection, {"error": f"refused by the job's rendezvous: {why}"})
        self._forget(connection)

    def _drop(self, connection: _Connection) -> None:
        self._forget(connection)
        if connection.instance is not None and not connection.left:
            if self._on_gone is not None and connection.instance not in self._lost:
                self._on_gone(connection.instance)  # (first: the failures it causes come after)
            self._declare_lost(connection.instance, "its process exited or closed its fabric connection")

    def _forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self._pending.pop(connection, None)
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
        self._take_exits(now)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, None)
        while self._pending:
            oldest = next(iter(self._pending))
            if now - oldest.opened < self._frame_deadline:
                break
            self._refuse(oldest, f"it did not check in within {self._frame_deadline:g} s of connecting")
        if self._checkin_deadline is not None and now >= self._checkin_deadline:
            self._start_up_timed_out()
        if not self._complete:
            return  # an instance waiting for the others sends no heartbeats; its exit is still seen at once
        for connection in list(self._checked_in.values()):
            if not connection.left and now - connection.last_seen > self._heartbeat_timeout:
                instance = connection.instance
                assert instance is not None
                if self.alive_here is not None and self.alive_here(instance):
                    connection.last_seen = now  # (asked again after another timeout's silence)
                    if instance not in self._busy_noted:
                        self._busy_noted.add(instance)
                        log.info("fabric: instance %d sent no heartbeat for %g s, but its process on this host is "
                                 "alive and running (a long call holding Python's GIL?): not lost",
                                 instance, self._heartbeat_timeout)
                    continue
                self._forget(connection)
                self._declare_lost(instance, self._silence(instance))

    def _silence(self, instance: int) -> str:
        """Why an instance's heartbeats stopped, as far as the launcher can tell."""
        silent = f"no heartbeat for {self._heartbeat_timeout:g} s"
        pid = self.stopped_here(instance) if self.stopped_here is not None else None
        if pid is not None:
            return f"{silent}: its process (pid {pid}) on this host is stopped (SIGSTOP or a debugger)"
        return f"{silent}: its host may be unreachable"

    def _take_exits(self, now: float) -> None:
        """The exits the launcher reported: those of instances that never checked in may fail start-up."""
        while self._exits:
            instance, how, when = self._exits.pop(0)
            if instance not in self._peers and instance not in self._lost:
                self._gone[instance] = (how, when)
        self._fail_start_for_the_gone(now)

    def _fail_start_for_the_gone(self, now: float) -> bool:
        """Start-up fails, every member checked in hearing why, if an instance exited without checking in
        (``exit_grace`` ago: no check-in of its can still come) while another has checked in (an instance
        waits in a collective it can never complete); whether it did."""
        if self._complete or self._timed_out or self._start_failure is not None or not self._checked_in:
            return False
        gone = sorted(i for i, (_, when) in self._gone.items() if i not in self._peers and now >= when + self._exit_grace)
        if not gone:
            return False
        self._checkin_deadline = None
        exits = ", ".join(f"instance {i} exited {self._gone[i][0]}" for i in gone)
        self._start_failure = message = (
            f"{exits}, without joining the fabric, so no collective of the whole job can complete: every instance "
            "must call the same collectives"
        )
        log.error("%s", message)
        for other in list(self._checked_in.values()):
            self._send(other, {"error": message})
        return True

    def _start_up_timed_out(self) -> None:
        self._checkin_deadline = None
        self._timed_out = True
        missing = tuple(i for i in range(self._num_instances) if i not in self._peers)
        message = (
            f"instances {_format_indices(missing)} did not check in to the fabric within "
            f"{self._checkin_timeout:g} s of the first"
        )
        log.error("%s", message)
        if self._on_timeout is not None:  # first: whoever sees a member fail with this can count on it
            self._on_timeout(missing, message)
        for other in list(self._checked_in.values()):
            self._send(other, {"error": message, "missing": list(missing)})

    def _send(self, connection: _Connection, message: dict[str, Any]) -> None:
        try:
            connection.sock.sendall(encode_frame(message))
        except OSError:
            pass  # its read side will see the loss
