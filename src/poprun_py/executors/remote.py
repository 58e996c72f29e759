"""A host's instances run by its agent: frames in, the supervisor's events out.

``AgentExecutor`` is the launcher's end of one agent channel. It sends the
START frame, waits (bounded) for the agent to spawn everything, then a reader
thread turns frames into ``Started``/``Output``/``Exited`` events. A channel
that ends before every instance has exited becomes one ``HostLost``.
Output goes through the queue's back-pressure, so a slow console slows the
remote instances down (SSH flow control) rather than losing or piling up bytes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Literal, Mapping, Sequence

from ..errors import EXIT_USAGE, PoprunError, ProgramNotExecutable, ProgramNotFound, UsageError
from ..events import EventQueue, Exited, HostLost, Output, Started, StartInterrupted
from ..plan import InstancePlan
from ..ranges import format_cpus
from . import wire
from .channels import AgentChannel, HostUnresponsive

log = logging.getLogger("poprun.remote")

#: Start failures the agent reports, by exit code, as the launcher's own error types.
_START_ERRORS: Mapping[int, type[PoprunError]] = {127: ProgramNotFound, 126: ProgramNotExecutable,
                                                  EXIT_USAGE: UsageError}


class AgentStartFailed(PoprunError):
    """An agent could not start its instances, or went away while doing so."""


def read_frame(channel: AgentChannel, decoder: wire.FrameDecoder, deadline: float | None) -> wire.Frame | None:
    """The next frame from ``channel`` (None at end of stream); TimeoutError after ``deadline``."""

    def read() -> bytes:
        return channel.read(None if deadline is None else max(0.0, deadline - time.monotonic()))

    return decoder.next_frame(read)


class AgentExecutor:
    """The instances of one host, spawned and watched by the agent at the end of ``channel``."""

    def __init__(self, host: str, channel: AgentChannel, events: EventQueue, *,
                 base_env: Mapping[str, str], grace: float, numa: bool, start_timeout: float,
                 unit: str | None = None, overload: bool = False) -> None:
        self.host = host
        self._channel = channel
        self._events = events
        self._base_env = dict(base_env)
        self._grace = grace
        #: The instances' binding there: to NUMA nodes, to a core or hardware thread each (``--bind-to``: the
        #: unit), units shared quietly.
        self._numa, self._unit, self._overload = numa, unit, overload
        self._start_timeout = start_timeout
        self._decoder = wire.FrameDecoder()
        self._live: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop_starting = False

    # -- starting ----------------------------------------------------------------
    def start(self, plans: Sequence[InstancePlan]) -> None:
        self.send_start(plans)
        self.await_ready()
        self.begin_pumping()

    def send_start(self, plans: Sequence[InstancePlan]) -> None:
        """The instances and their environment travel in this frame, never in argv."""
        start = {
            "host": self.host,
            "grace": self._grace,
            "numa": self._numa,
            "unit": self._unit,
            "overload": self._overload,
            "base_env": self._base_env,
            "instances": [
                {"index": p.index, "local_index": p.local_index, "argv": list(p.argv), "env": dict(p.env), "cwd": p.cwd}
                for p in plans
            ],
        }
        self._live = {p.index for p in plans}
        try:
            self._channel.send(wire.encode_json(wire.Kind.START, start))
        except OSError as exc:
            raise AgentStartFailed(f"{self.host}: the agent's channel closed before the start ({exc})") from None

    def stop_starting(self) -> None:
        """Called from a signal handler: ``await_ready`` gives up (closing the channel stops the agent)."""
        self._stop_starting = True

    def await_ready(self) -> None:
        """Block until the agent has spawned every instance; its start errors become ours."""
        deadline = time.monotonic() + self._start_timeout
        while True:
            if self._stop_starting:
                raise StartInterrupted(0, len(self._live))
            try:  # in short steps, so that a signal stops the wait
                frame = read_frame(self._channel, self._decoder, min(deadline, time.monotonic() + 0.2))
            except TimeoutError:
                if time.monotonic() < deadline:
                    continue
                raise AgentStartFailed(
                    f"{self.host}: the agent did not start its instances within {self._start_timeout:g}s") from None
            if frame is None:
                tail = "; ".join(self._channel.stderr_tail()[-3:]) or "no message"
                raise AgentStartFailed(f"{self.host}: the agent exited while starting its instances ({tail})")
            if frame.kind == wire.Kind.READY:
                return
            if frame.kind == wire.Kind.FAILED:
                failure = frame.json()
                error = _START_ERRORS.get(failure["exit_code"], AgentStartFailed)
                raise error(f"{self.host}: {failure['message']}")
            self._dispatch(frame)

    def begin_pumping(self) -> None:
        self._thread = threading.Thread(target=self._pump_safely, name=f"poprun-agent-{self.host}", daemon=True)
        self._thread.start()

    # -- stopping ----------------------------------------------------------------------
    def signal_all(self, signum: int) -> list[int]:
        with self._lock:
            live = sorted(self._live)
        if not live:
            return []
        try:
            self._channel.send(wire.encode_json(wire.Kind.SIGNAL, {"signum": int(signum)}))
        except (OSError, EOFError):
            return []  # the channel is gone: the agent is already stopping them, and HostLost follows
        return live

    def kill_all(self) -> list[int]:
        return self.signal_all(signal.SIGKILL)

    def cleanup(self) -> None:
        """Closing the channel makes the agent stop anything still running."""
        self._channel.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the pump ------------------------------------------------------------------------
    def _pump_safely(self) -> None:
        reason = "the connection closed"
        try:
            while self._live:
                frame = read_frame(self._channel, self._decoder, None)
                if frame is None:
                    break
                self._dispatch(frame)
        except HostUnresponsive as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever broke the channel, the instances are lost
            log.debug("reading from %s failed", self.host, exc_info=True)
            reason = f"reading its agent's channel failed: {type(exc).__name__}: {exc}"
        with self._lock:
            lost = tuple(sorted(self._live))
            self._live.clear()
        if lost:
            tail = self._channel.stderr_tail()
            if tail:
                reason += f" (agent: {tail[-1]})"
            self._events.put(HostLost(self.host, lost, reason))

    def _dispatch(self, frame: wire.Frame) -> None:
        if frame.kind in (wire.Kind.STDOUT, wire.Kind.STDERR):
            stream: Literal["stdout", "stderr"] = "stdout" if frame.kind == wire.Kind.STDOUT else "stderr"
            self._events.put_output(Output(frame.instance, stream, frame.payload))
        elif frame.kind == wire.Kind.STARTED:
            started = frame.json()
            if started.get("cpus"):
                log.debug("instance %d on %s: CPUs %s", frame.instance, self.host, format_cpus(started["cpus"]))
            self._events.put(Started(frame.instance, int(started["pid"]), self.host))
        elif frame.kind == wire.Kind.EXITED:
            exited: dict[str, Any] = frame.json()
            with self._lock:
                self._live.discard(frame.instance)
            self._events.put(Exited(frame.instance, int(exited["pid"]), self.host, exited["returncode"],
                                    exited["signal"], time.monotonic()))
        elif frame.kind == wire.Kind.FAILED:
            log.error("%s: %s", self.host, frame.json()["message"])
        else:
            raise wire.ProtocolError(f"unexpected {frame.kind.name} frame from the agent")
