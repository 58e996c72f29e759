"""The agent: ``python -m poprun_py.agent``, one per remote host, started over SSH or by srun.

It says hello (version, Python, platform), takes one START frame (the
instances and their environment), spawns them with the same ``LocalExecutor``
as a local launch and streams its events back as frames on stdout. SIGNAL
frames are passed on to the instances' groups. SIGUSR1 and SIGUSR2 sent to
the agent itself it lives through (``scancel --signal`` in a Slurm step: Slurm
signals the instances too).

When the channel closes (the launcher died, even by SIGKILL, or its host
dropped off) or the agent is told to stop by a signal, the instances get
SIGTERM and, after the grace period, SIGKILL. If the agent itself is killed,
its guardian kills them. Either way nothing is left behind on this host.
"""

from __future__ import annotations

import logging
import os
import platform
import select
import signal
import socket
import sys
import threading
from typing import Any, Mapping

from .. import __version__
from ..errors import EXIT_INTERNAL, PoprunError
from ..events import EventQueue, Exited, HostLost, Output, Started, StartInterrupted
from ..hosts import HostSpec
from ..plan import OMP_NUM_THREADS, InstancePlan, omp_threads
from ..programs import resolve_program
from . import wire
from .descriptors import check_descriptor_limit
from .guardian import Guardian
from .local import LocalExecutor

log = logging.getLogger("poprun.agent")
_STDIN, _STDOUT = 0, 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: Not the agent's to die of. Inside a Slurm allocation the agent is a job step's task, so
#: ``scancel --signal=USR1`` and ``--signal=USR1@120`` ("checkpoint now") reach it, not poprun; before, it died
#: of them and the whole job was lost. Slurm's process tracking (proctrack/cgroup, linuxproc) signals every
#: process of the step, the instances too, so the agent only lives on: passing it on would deliver it twice.
#: (poprun passes on the ones it receives itself as SIGNAL frames.)
_LIVES_THROUGH = (signal.SIGUSR1, signal.SIGUSR2)


def hello() -> dict[str, Any]:
    """What the launcher checks before it trusts this agent with a job."""
    return {
        "version": __version__,
        "protocol": wire.PROTOCOL_VERSION,
        "python": platform.python_version(),
        "platform": sys.platform,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "ssh_connection": os.environ.get("SSH_CONNECTION", ""),  # the host's address behind a ProxyJump
    }


class _Channel:
    """Frames to and from the launcher over stdin/stdout; a write to a closed channel is dropped."""

    def __init__(self) -> None:
        self._decoder = wire.FrameDecoder()
        self.closed = threading.Event()
        self.silence_limit: float | None = None  # set by the launcher's first KEEPALIVE
        self.ended = "the launcher's channel closed"

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view and not self.closed.is_set():
                view = view[os.write(_STDOUT, view):]
        except OSError:  # the launcher is gone: stopping is the reader's job
            self.closed.set()

    def receive(self) -> wire.Frame | None:
        """The next frame from the launcher; None once the channel has closed or the launcher fell silent.

        Over SSH the launcher's KEEPALIVE frames carry how long it may stay silent: a cut link
        reaches no one here for many minutes, so the agent keeps its own count.
        """
        while True:
            frame = self._decoder.next_frame(self._read)
            if frame is None:
                self.closed.set()
                return None
            if frame.kind != wire.Kind.KEEPALIVE:
                return frame
            self.silence_limit = float(frame.json()["silence_limit"])

    def _read(self) -> bytes:
        """Bytes from the launcher; none at the end of the channel or after too long a silence."""
        if self.silence_limit is not None and not _readable(_STDIN, self.silence_limit):
            self.ended = f"nothing from the launcher for {self.silence_limit:g}s (its host or link is down)"
            return b""
        return os.read(_STDIN, 1 << 16)


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


class _Stopper:
    """Stops the instances once: SIGTERM now, SIGKILL when the grace period is over."""

    def __init__(self, executor: LocalExecutor, grace: float) -> None:
        self._executor = executor
        self._grace = grace
        self._lock = threading.Lock()
        self._started = False
        self.finished = threading.Event()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self._started or self.finished.is_set():
                return
            self._started = True
        log.warning("%s: stopping this host's instances", reason)
        threading.Thread(target=self._stop, name="poprun-agent-stop", daemon=True).start()

    def _stop(self) -> None:
        self._executor.signal_all(signal.SIGTERM)
        if not self.finished.wait(self._grace):
            self._executor.kill_all()


def _with_omp_share(env: dict[str, str], base_env: Mapping[str, str], instances_here: int) -> dict[str, str]:
    """Several instances here and nobody chose OMP_NUM_THREADS: each its share of this host's CPUs."""
    if instances_here < 2 or any(OMP_NUM_THREADS in where for where in (env, base_env, os.environ)):
        return env
    return {**env, OMP_NUM_THREADS: str(omp_threads(len(os.sched_getaffinity(0)), instances_here))}


def _plans(start: Mapping[str, Any]) -> list[InstancePlan]:
    """The START frame's instances, their programs found here and bound to this host's NUMA nodes."""
    instances = start["instances"]
    cpus: list[tuple[int, ...] | None] = [None] * len(instances)
    if start.get("numa"):
        from ..numa import local_placement

        try:
            unit = start.get("unit") if start.get("unit") in ("core", "hwthread") else None
            cpus = [placed for _, placed in local_placement(len(instances), unit, bool(start.get("overload")))]
        except ValueError as exc:
            log.warning("NUMA placement is off on this host: %s", exc)
    plans = []
    for item, bound in zip(instances, cpus):
        env = _with_omp_share(item["env"], start["base_env"], len(instances))
        found_with = {**os.environ, **start["base_env"], **env}
        argv = (resolve_program(item["argv"][0], found_with, item["cwd"]), *item["argv"][1:])
        plans.append(InstancePlan(item["index"], HostSpec(start["host"]), item["local_index"], argv,
                                  env, item["cwd"], (), bound))
    return plans


def _forward(events: EventQueue, channel: _Channel, plans: list[InstancePlan], stopper: _Stopper) -> None:
    """Every instance event becomes a frame until each instance has exited."""
    indices = {p.index for p in plans}
    cpus = {p.index: p.cpus for p in plans}
    while indices:
        event = events.get(None)
        if isinstance(event, Output):
            kind = wire.Kind.STDOUT if event.stream == "stdout" else wire.Kind.STDERR
            channel.send(wire.encode(kind, event.data, event.instance))
        elif isinstance(event, Started):
            started = {"pid": event.pid, "cpus": cpus.get(event.instance)}
            channel.send(wire.encode_json(wire.Kind.STARTED, started, event.instance))
        elif isinstance(event, Exited):
            indices.discard(event.instance)
            channel.send(wire.encode_json(
                wire.Kind.EXITED, {"pid": event.pid, "returncode": event.returncode, "signal": event.signal},
                event.instance))
        elif isinstance(event, HostLost):  # the pump failed: the launcher names it, we stop
            stopper.stop(event.reason)
            channel.send(wire.encode_json(wire.Kind.FAILED, {"exit_code": EXIT_INTERNAL, "message": event.reason}))
            return
    stopper.finished.set()


def _read_signals(channel: _Channel, executor: LocalExecutor, stopper: _Stopper) -> None:
    while True:
        frame = channel.receive()
        if frame is None:
            executor.stop_starting()  # the launcher gave up while this host was still starting
            stopper.stop(channel.ended)
            return
        if frame.kind == wire.Kind.SIGNAL:
            executor.signal_all(int(frame.json()["signum"]))


def serve() -> int:
    """Run one job's instances on this host; the exit status says whether the start worked."""
    for signum in _LIVES_THROUGH:  # (caught, not ignored: an exec resets a caught signal, so instances get them)
        signal.signal(signum, lambda *_: None)
    channel = _Channel()
    channel.send(wire.MAGIC + wire.encode_json(wire.Kind.HELLO, hello()))
    frame = channel.receive()
    if frame is None or frame.kind != wire.Kind.START:
        return 0  # a pre-flight check only, or the launcher gave up
    start = frame.json()
    try:
        check_descriptor_limit(len(start["instances"]))
    except PoprunError as exc:
        channel.send(wire.encode_json(wire.Kind.FAILED, {"exit_code": exc.exit_code, "message": str(exc)}))
        return 1
    events = EventQueue()
    guardian = Guardian(float(start["grace"]))
    executor = LocalExecutor(events, {**os.environ, **start["base_env"]}, guardian, adopt_orphans=True)
    stopper = _Stopper(executor, float(start["grace"]))

    def on_signal(signum: int, _frame: object) -> None:
        executor.stop_starting()
        stopper.stop(f"received {signal.Signals(signum).name}")

    for signum in _STOP_SIGNALS:
        signal.signal(signum, on_signal)
    # Read from the start: a launcher stopped during start-up closes the channel, and the start stops.
    threading.Thread(target=_read_signals, args=(channel, executor, stopper), daemon=True).start()
    try:
        plans = _plans(start)
        executor.start(plans)
    except (PoprunError, StartInterrupted) as exc:
        code = exc.exit_code if isinstance(exc, PoprunError) else EXIT_INTERNAL
        channel.send(wire.encode_json(wire.Kind.FAILED, {"exit_code": code, "message": str(exc)}))
        guardian.close()
        return 1
    try:
        channel.send(wire.encode(wire.Kind.READY))
        _forward(events, channel, plans, stopper)
    finally:
        executor.join(2.0)
        executor.cleanup()
        guardian.close()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {os.getpid()} AGENT %(levelname).1s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        return serve()
    except wire.ProtocolError as exc:
        log.error("not a poprun launcher at the other end: %s", exc)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
