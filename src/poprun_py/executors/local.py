"""Spawning instances on this host: sessions, pipes, one pump thread, reaping.

Each instance runs in a session (and so a process group) of its own, so a
signal reaches it and its children and never the launcher's terminal group.
One pump thread per executor multiplexes every pipe and every process-exit
notification (pidfd) with a selector; it only reads and enqueues events.
An instance's ``Exited`` is posted after its last ``Output``.

How a process comes to be is the one thing that varies: ``exec_program``
(the default) runs the plan's argv; ``executors.forked.ForkSpawner`` forks
this process to run a Python function. Pumping, signalling and reaping are
the same for both.
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Collection, Iterator, Mapping, Protocol, Sequence

from ..errors import ProgramNotExecutable, ProgramNotFound
from ..events import EventQueue, Exited, HostLost, Output, Started, Stream
from ..plan import InstancePlan
from .guardian import Guardian

log = logging.getLogger("poprun.local")

READ_SIZE = 1 << 18
PIPE_SIZE = 1 << 20
#: After an instance exits, how long a child it left behind may hold its pipes open.
DRAIN_SECONDS = 2.0


class Process(Protocol):
    """What the executor needs of a started instance (``subprocess.Popen`` has it)."""

    pid: int
    returncode: int | None

    def wait(self) -> int: ...


class Spawner(Protocol):
    """Starts one instance in a session of its own, its stdout/stderr on the given descriptors.

    ``foreign_fds`` are the launcher's descriptors the instance must not keep
    (other instances' pipes and devices, the guardian's pipe); a spawner that
    execs closes them anyway, one that forks must close them in the child.
    """

    def __call__(
        self, plan: InstancePlan, env: Mapping[str, str], stdout: int, stderr: int, foreign_fds: Collection[int]
    ) -> Process: ...


def exec_program(
    plan: InstancePlan, env: Mapping[str, str], stdout: int, stderr: int, foreign_fds: Collection[int]
) -> subprocess.Popen:
    """The default spawner: run the plan's argv (``close_fds`` takes care of ``foreign_fds``)."""
    try:
        return subprocess.Popen(
            plan.argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=dict(env),
            cwd=plan.cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=plan.pass_fds,
        )
    except FileNotFoundError:
        raise ProgramNotFound(f"{plan.argv[0]}: no such program") from None
    except PermissionError:
        raise ProgramNotExecutable(f"{plan.argv[0]}: permission denied (is it executable?)") from None


@dataclass(eq=False)
class _Instance:
    plan: InstancePlan
    process: Process
    open_streams: set[Stream] = field(default_factory=lambda: {"stdout", "stderr"})
    reaped: bool = False
    drain_deadline: float | None = None
    exited_posted: bool = False


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:  # fewer wake-ups per line when an instance prints fast
        fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass
    return read_fd, write_fd


@contextmanager
def _bound_to(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Bind the calling thread to ``cpus`` while it forks an instance (NUMA placement), then restore.

    Affinity is per thread and inherited at fork, so the instance is bound from
    its first instruction, and so is anything it starts; no other thread moves.
    """
    if cpus is None:
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


class LocalExecutor:
    """Runs a set of instances on this host and reports them as events."""

    def __init__(
        self,
        events: EventQueue,
        base_env: Mapping[str, str],
        guardian: Guardian | None = None,
        spawn: Spawner = exec_program,
    ) -> None:
        self._events = events
        self._base_env = dict(base_env)
        self._guardian = guardian
        self._spawn_process = spawn
        self._instances: dict[int, _Instance] = {}
        self._selector = selectors.DefaultSelector()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- starting -----------------------------------------------------------
    def start(self, plans: Sequence[InstancePlan]) -> None:
        """Spawn every instance, then start pumping; a half-failed start stops what it began."""
        device_fds = {fd for plan in plans for fd in plan.pass_fds}
        try:
            for plan in plans:
                self._spawn(plan, device_fds - set(plan.pass_fds))
        except BaseException:
            self.kill_all()
            self._reap_all_now()
            raise
        self._thread = threading.Thread(target=self._pump_safely, name="poprun-pump", daemon=True)
        self._thread.start()

    def _spawn(self, plan: InstancePlan, others_devices: set[int]) -> None:
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        foreign: set[int] = others_devices | set(self._selector.get_map()) | {out_r, err_r}  # type: ignore[assignment]  # (keys: the fds registered)
        if self._guardian is not None:
            foreign.add(self._guardian.fileno())
        try:
            with _bound_to(plan.cpus):  # inherited at fork: bound before its first instruction
                process = self._spawn_process(plan, {**self._base_env, **plan.env}, out_w, err_w, foreign)
        except BaseException:
            os.close(out_r), os.close(err_r)  # type: ignore[func-returns-value]
            raise
        finally:
            os.close(out_w), os.close(err_w)  # type: ignore[func-returns-value]
        if self._guardian is not None:
            self._guardian.watch(process.pid)
        instance = _Instance(plan, process)
        self._instances[plan.index] = instance
        self._selector.register(out_r, selectors.EVENT_READ, (instance, "stdout"))
        self._selector.register(err_r, selectors.EVENT_READ, (instance, "stderr"))
        pidfd = os.pidfd_open(process.pid)
        self._selector.register(pidfd, selectors.EVENT_READ, (instance, "exit"))
        self._events.put(Started(plan.index, process.pid, str(plan.host)))
        log.debug("Started instance %d (pid %d): %s", plan.index, process.pid, " ".join(plan.argv))

    # -- stopping ------------------------------------------------------------
    def signal_all(self, signum: int) -> list[int]:
        """Send ``signum`` to the process group of every instance not yet reaped."""
        sent = []
        with self._lock:
            live = [i for i in self._instances.values() if not i.reaped]
        for instance in live:
            try:
                os.killpg(instance.process.pid, signum)
                sent.append(instance.plan.index)
            except ProcessLookupError:
                pass
        return sent

    def kill_all(self) -> list[int]:
        return self.signal_all(signal.SIGKILL)

    def cleanup(self) -> None:
        """Kill whatever is left in the instances' groups (children they left behind)."""
        for instance in self._instances.values():
            try:
                os.killpg(instance.process.pid, signal.SIGKILL)
                log.debug("killed processes left in the group of instance %d", instance.plan.index)
            except ProcessLookupError:
                pass
            if self._guardian is not None:
                self._guardian.release(instance.process.pid)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _reap_all_now(self) -> None:
        for instance in self._instances.values():
            instance.process.wait()
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)
            os.close(key.fd)

    # -- the pump --------------------------------------------------------------
    def _pump_safely(self) -> None:
        try:
            self._pump()
        except Exception as exc:  # a bug must surface as an event, never vanish with the thread
            log.debug("pump failed", exc_info=True)
            lost = tuple(i.plan.index for i in self._instances.values() if not i.exited_posted)
            self._events.put(HostLost("localhost", lost, f"the output pump failed: {type(exc).__name__}: {exc}"))

    def _pump(self) -> None:
        while self._selector.get_map():
            for key, _ in self._selector.select(self._next_timeout()):
                instance, what = key.data
                if what == "exit":
                    self._on_exit(key.fd, instance)
                else:
                    self._on_readable(key.fd, instance, what)
            self._expire_drains()

    def _next_timeout(self) -> float | None:
        deadlines = [i.drain_deadline for i in self._instances.values() if i.drain_deadline and not i.exited_posted]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _on_readable(self, fd: int, instance: _Instance, stream: Stream) -> None:
        data = os.read(fd, READ_SIZE)
        if data:
            self._events.put_output(Output(instance.plan.index, stream, data))
            return
        self._selector.unregister(fd)
        os.close(fd)
        instance.open_streams.discard(stream)
        self._maybe_post_exit(instance)

    def _on_exit(self, pidfd: int, instance: _Instance) -> None:
        self._selector.unregister(pidfd)
        os.close(pidfd)
        instance.process.wait()
        with self._lock:
            instance.reaped = True
        instance.drain_deadline = time.monotonic() + DRAIN_SECONDS
        self._maybe_post_exit(instance)

    def _expire_drains(self) -> None:
        now = time.monotonic()
        for instance in self._instances.values():
            if instance.exited_posted or instance.drain_deadline is None or now < instance.drain_deadline:
                continue
            log.warning(
                "instance %d exited but a process it started still holds its output open; no longer reading it",
                instance.plan.index,
            )
            for key in list(self._selector.get_map().values()):
                if key.data[0] is instance:
                    self._selector.unregister(key.fd)
                    os.close(key.fd)
            instance.open_streams.clear()
            self._maybe_post_exit(instance)

    def _maybe_post_exit(self, instance: _Instance) -> None:
        if instance.exited_posted or not instance.reaped or instance.open_streams:
            return
        instance.exited_posted = True
        code: int = instance.process.returncode  # type: ignore[assignment]  # (reaped: set)
        self._events.put(
            Exited(
                instance.plan.index,
                instance.process.pid,
                str(instance.plan.host),
                returncode=code if code >= 0 else None,
                signal=-code if code < 0 else None,
                time=time.monotonic(),
            )
        )
