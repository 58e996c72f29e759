"""Spawning instances on this host: sessions, pipes, one pump thread, reaping.

Each instance runs in a session (and so a process group) of its own, so a
signal reaches it and its children and never the launcher's terminal group.
One pump thread per executor multiplexes every pipe and every process-exit
notification (pidfd) with a selector; it only reads and enqueues events.
An instance's ``Exited`` is posted after its last ``Output``.

No signal ever reaches a process that may not be ours: an exited instance's
status is read with ``WNOWAIT`` and its zombie kept until ``cleanup``, so its
PID (its group's and session's ID too) cannot go to another process while
any ``killpg`` of its group, the last included, may still come.

The instances' pidfds go to the guardian as they start; with
``adopt_orphans`` the launcher is a child subreaper (``adoption.py``) and
kills what the instances daemonised at the end. ``stop_starting`` (from a
signal handler) makes a start in progress stop spawning and undo itself.

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
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Collection, Iterator, Mapping, Protocol, Sequence

from ..events import EventQueue, Exited, HostLost, Output, Started, StartInterrupted, Stream
from ..plan import InstancePlan
from ..programs import exec_program
from .adoption import Adopter, become_subreaper, child_pids, process_state
from .guardian import Guardian
from .polling import readable

log = logging.getLogger("poprun.local")

READ_SIZE = 1 << 18
PIPE_SIZE = 1 << 20
#: After an instance exits, how long a child it left behind may hold its pipes open.
DRAIN_SECONDS = 2.0
#: How often the pump reaps adopted orphans that have exited (only with ``adopt_orphans``).
REAP_ADOPTED_SECONDS = 1.0
#: How long ``cleanup`` waits for killed instances to exit before it gives up on reaping them.
REAP_SECONDS = 10.0
#: The signals that ask an instance to end (poprun's stop, and those it forwards): SIGCONT follows each.
#: (Not SIGUSR1/SIGUSR2: those ask it to go on, and must not resume an instance a user stopped.)
STOPPING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


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


@dataclass(eq=False)
class _Instance:
    plan: InstancePlan
    process: Process
    pidfd: int
    open_streams: set[Stream] = field(default_factory=lambda: {"stdout", "stderr"})
    exited: bool = False  # its status is known; it stays a zombie until reaped
    reaped: bool = False
    returncode: int | None = None
    drain_deadline: float | None = None
    exited_posted: bool = False


def _exit_status(pid: int) -> int:
    """The exit status of an exited child, left unreaped (``WNOWAIT``): -N when signal N killed it."""
    result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert result is not None  # no WNOHANG: it has exited
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status


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
        adopt_orphans: bool = False,
    ) -> None:
        """``adopt_orphans`` makes this process a child subreaper: only for a process that is
        the launcher and nothing else (poprun, the agent), never a user's own process."""
        self._events = events
        self._base_env = {**base_env, **(guardian.environment if guardian is not None else {})}
        self._guardian = guardian
        self._spawn_process = spawn
        self._adopt_orphans = adopt_orphans
        self._adopter: Adopter | None = None
        self._instances: dict[int, _Instance] = {}
        self._selector = selectors.DefaultSelector()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop_starting = False
        self._cleaned = False
        self._next_adopted_reap = 0.0

    # -- starting -----------------------------------------------------------
    def stop_starting(self) -> None:
        """Called from a signal handler: a start in progress spawns no more and raises ``StartInterrupted``."""
        self._stop_starting = True

    def start(self, plans: Sequence[InstancePlan]) -> None:
        """Spawn every instance, then start pumping; a half-failed start stops what it began."""
        if self._adopt_orphans and become_subreaper():
            spared = child_pids()  # the launcher's own children (agents' channels): not the job's
            guardian = self._guardian
            self._adopter = Adopter(lambda: spared | ({guardian.pid} if guardian is not None else set()))
        device_fds = {fd for plan in plans for fd in plan.pass_fds}
        try:
            for plan in plans:
                if self._stop_starting:
                    raise StartInterrupted(len(self._instances), len(plans))
                self._spawn(plan, device_fds - set(plan.pass_fds))
        except BaseException:
            self.kill_all()
            self.cleanup()
            raise
        if self._guardian is not None:
            guardian_fd = self._guardian.process_fd()
            self._selector.register(guardian_fd, selectors.EVENT_READ, (None, "guardian"))
        self._thread = threading.Thread(target=self._pump_safely, name="poprun-pump", daemon=True)
        self._thread.start()

    def _spawn(self, plan: InstancePlan, others_devices: set[int]) -> None:
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        foreign: set[int] = set()
        if self._spawn_process is not exec_program:  # exec closes them all; a fork must close each
            foreign = others_devices | {key.fd for key in self._selector.get_map().values()} | {out_r, err_r}
            foreign.update(instance.pidfd for instance in self._instances.values())
            if self._guardian is not None:
                foreign.add(self._guardian.fileno())
        try:
            with _bound_to(plan.cpus):  # inherited at fork: bound before its first instruction
                process = self._spawn_process(plan, {**self._base_env, **plan.env}, out_w, err_w, foreign)
        except BaseException:
            os.close(out_r), os.close(err_r)  # type: ignore[func-returns-value]
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        pidfd = os.pidfd_open(process.pid)  # our unreaped child: the pid names it
        instance = _Instance(plan, process, pidfd)
        with self._lock:  # signal_all may run in another thread (the agent's channel reader)
            self._instances[plan.index] = instance
        if self._guardian is not None:
            self._guardian.watch(process.pid, pidfd)
        self._selector.register(out_r, selectors.EVENT_READ, (instance, "stdout"))
        self._selector.register(err_r, selectors.EVENT_READ, (instance, "stderr"))
        self._selector.register(pidfd, selectors.EVENT_READ, (instance, "exit"))
        self._events.put(Started(plan.index, process.pid, str(plan.host)))
        log.debug("Started instance %d (pid %d): %s", plan.index, process.pid, " ".join(plan.argv))

    # -- stopping ------------------------------------------------------------
    def alive_here(self, index: int) -> bool:
        """Whether instance ``index`` runs on this host, alive and not stopped. Then its fabric heartbeats
        missing cannot mean it is gone (its exit closes its fabric connection at once): it is busy, say in a
        long call that holds Python's GIL, so that its heartbeat thread cannot run."""
        _, state = self._state_here(index)
        return state is not None and state not in "TtZXx"

    def stopped_here(self, index: int) -> int | None:
        """The pid of instance ``index`` if it runs on this host and is stopped (SIGSTOP, Ctrl-Z's SIGTSTP, a
        debugger), else None: the reason its peers get when its heartbeats stop, instead of a lost host."""
        pid, state = self._state_here(index)
        return pid if state is not None and state in "Tt" else None

    def _state_here(self, index: int) -> tuple[int, str | None]:
        """Instance ``index``'s pid and /proc state letter (None: not here, exited or gone). Its pid is ours
        until ``cleanup`` reaps it, so the state read is that instance's."""
        with self._lock:
            instance = self._instances.get(index)
            if instance is None or instance.exited or instance.reaped:
                return 0, None
            return instance.process.pid, process_state(instance.process.pid)

    def signal_all(self, signum: int) -> list[int]:
        """Send ``signum`` to the process group of every instance still running.

        A signal that stops the job (``STOPPING``) is followed by SIGCONT, as Slurm and Open MPI do: a
        stopped process (SIGSTOP, a debugger's) acts on no signal but SIGKILL, so without it a stopped
        instance would run none of its handlers and the job would wait out the whole stop grace.

        Safe by construction: an instance is reaped only in ``cleanup``, so each
        group's leader still holds the group's number when it is signalled.
        """
        sent = []
        with self._lock:
            live = [i for i in self._instances.values() if not i.exited and not i.reaped]
        for instance in live:
            try:
                os.killpg(instance.process.pid, signum)
                if signum in STOPPING:
                    os.killpg(instance.process.pid, signal.SIGCONT)
                sent.append(instance.plan.index)
            except ProcessLookupError:
                pass
        return sent

    def kill_all(self) -> list[int]:
        return self.signal_all(signal.SIGKILL)

    def cleanup(self) -> None:
        """Kill whatever is left of the job on this host, then reap the instances (once).

        Each group gets SIGKILL before its leader is reaped, while the leader's
        zombie still holds the number; then what the instances daemonised is
        killed: adopted by this process (``Adopter.kill_adopted``), or, in a
        caller's process, found by the guardian's token (``kill_marked``).
        """
        with self._lock:
            if self._cleaned:
                return
            self._cleaned = True
        instances = [i for i in self._instances.values() if not i.reaped]
        for instance in instances:
            try:
                os.killpg(instance.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(instances)
        if self._adopter is not None:
            self._adopter.kill_adopted([i.process.pid for i in self._instances.values() if not i.reaped])
        elif self._guardian is not None and self._instances:  # in a caller's process: no subreaper
            if killed := self._guardian.kill_marked():
                log.debug("killed %d processes the instances left behind (daemons)", killed)
        if self._thread is not None and self._thread.is_alive():
            return  # the pump still reads (it gave up on nothing yet): its descriptors stay open
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)
            if key.data[1] == "exit" and self._guardian is not None:
                self._guardian.release(key.fd)
            os.close(key.fd)

    def _reap(self, instances: list[_Instance]) -> None:
        """Reap each instance once it has died (bounded: one in uninterruptible sleep is left)."""
        deadline = time.monotonic() + REAP_SECONDS
        for instance in instances:
            if not readable([instance.pidfd], deadline - time.monotonic()):
                log.warning("instance %d (pid %d) did not die after SIGKILL; not reaping it",
                            instance.plan.index, instance.process.pid)
                continue
            instance.process.wait()
            with self._lock:
                instance.reaped = True
            if self._guardian is not None:
                self._guardian.release(instance.pidfd)
            if instance.pidfd not in self._selector.get_map():
                os.close(instance.pidfd)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the pump --------------------------------------------------------------
    def _pump_safely(self) -> None:
        try:
            self._pump()
        except Exception as exc:  # a bug must surface as an event, never vanish with the thread
            log.debug("pump failed", exc_info=True)
            lost = tuple(i.plan.index for i in self._instances.values() if not i.exited_posted)
            self._events.put(HostLost("localhost", lost, f"the output pump failed: {type(exc).__name__}: {exc}"))

    def _pump(self) -> None:
        while any(not i.exited_posted for i in self._instances.values()):
            for key, _ in self._selector.select(self._next_timeout()):
                instance, what = key.data
                if what == "exit":
                    self._on_exit(key.fd, instance)
                elif what == "guardian":
                    self._on_guardian_died(key.fd)
                else:
                    self._on_readable(key.fd, instance, what)
            self._expire_drains()
            self._reap_adopted()

    def _next_timeout(self) -> float | None:
        deadlines = [i.drain_deadline for i in self._instances.values() if i.drain_deadline and not i.exited_posted]
        if self._adopter is not None:
            deadlines.append(self._next_adopted_reap)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _reap_adopted(self) -> None:
        if self._adopter is None or time.monotonic() < self._next_adopted_reap:
            return
        self._next_adopted_reap = time.monotonic() + REAP_ADOPTED_SECONDS
        self._adopter.reap_exited([i.process.pid for i in self._instances.values()])

    def _on_guardian_died(self, fd: int) -> None:
        self._selector.unregister(fd)
        os.close(fd)
        assert self._guardian is not None
        replacement = self._guardian.replace()
        if replacement is not None:
            self._selector.register(replacement, selectors.EVENT_READ, (None, "guardian"))

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
        """Its status, not its zombie: that is reaped in ``cleanup``, after its group's last signal."""
        self._selector.unregister(pidfd)
        instance.returncode = _exit_status(instance.process.pid)
        with self._lock:
            instance.exited = True
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
        if instance.exited_posted or not instance.exited or instance.open_streams:
            return
        instance.exited_posted = True
        code = instance.returncode
        assert code is not None
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

