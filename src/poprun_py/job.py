"""The supervisor: one loop over one event queue, first failure wins.

Executors report ``Started``/``Output``/``Exited``/``HostLost``; signals to
the launcher arrive as ``SignalReceived`` on the same queue. The first
instance to fail (or the first signal, or the end of a ``TimeLimit``) stops
every other instance: the signal, then SIGKILL once the grace period is
over. One deadline for the whole stop; the loop never waits unboundedly.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from .console import log_to_open_stream
from .events import (
    ConsoleClosed,
    EventQueue,
    Exited,
    HostLost,
    Output,
    PeerGone,
    SignalReceived,
    Started,
    StartInterrupted,
    StartupTimedOut,
    Stream,
)
from .hosts import HostSpec
from .output import OutputRouter
from .plan import InstancePlan
from .ranges import counted, named_instances
from .report import Failure, JobReport
from .status import StatusLine

log = logging.getLogger("poprun.job")

#: How long instances may take to die after SIGKILL before poprun gives up on them.
REAP_AFTER_KILL_SECONDS = 10.0
#: How long an instance that left the fabric (its program ended, or it died) may take to be reaped, once a peer
#: has failed of its loss, before poprun stops the job: its own exit status decides whether it is the first
#: failure, and a stop sent before it would have it die of poprun's signal instead.
CAUSE_WAIT_SECONDS = 3.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: Signals passed on to every running instance, the job going on, as mpirun does: a scheduler's "checkpoint
#: now, you will be stopped soon" (Slurm's ``--signal=USR1@120``, ``scancel --signal=USR1``). Their default
#: action is to terminate, so without a handler poprun itself died of one and its instances were killed.
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
#: Ctrl-Z: poprun erases its status line, then stops as the default action would; the instances, in sessions of
#: their own, go on. Handled only where the status line can be shown: elsewhere the default action is the same.
SUSPEND_SIGNAL = signal.SIGTSTP
#: A stop signal this soon after the first is the same keypress delivered twice (to poprun and to a
#: wrapper that forwards it, say), not a second Ctrl-C: it does not kill at once.
REPEAT_WINDOW_SECONDS = 0.5


@dataclass(frozen=True)
class TimeLimit:
    """How long a job may run (start-up included) before it is stopped, like ``mpirun --timeout``.

    At the end the instances get ``signum``: SIGTERM, or a signal on which they
    dump their stacks and die (``mpirun --get-stack-traces``; the forked
    function instances register faulthandler on SIGUSR1); SIGKILL follows
    after the grace period.
    """

    seconds: float
    signum: int = signal.SIGTERM


class Executor(Protocol):
    """What the supervisor needs of an executor: local, on a host through its agent (ssh or srun), or both."""

    def start(self, plans: Sequence[InstancePlan]) -> None: ...
    def stop_starting(self) -> None: ...
    def signal_all(self, signum: int) -> list[int]: ...
    def kill_all(self) -> list[int]: ...
    def cleanup(self) -> None: ...
    def join(self, timeout: float) -> None: ...


class Job:
    """Runs one plan's instances to the end and says how it went."""

    def __init__(
        self,
        executor: Executor,
        events: EventQueue,
        router: OutputRouter,
        num_instances: int,
        grace: float,
        status: StatusLine | None = None,
        on_started: Callable[[], None] | None = None,
        time_limit: TimeLimit | None = None,
        on_clean_exit: Callable[[int, str], None] | None = None,
    ) -> None:
        self._on_started = on_started
        #: ``(instance, how)``: an instance exited with code 0 (the fabric's rendezvous wants to know).
        self._on_clean_exit = on_clean_exit
        self._time_limit = time_limit
        self._time_deadline: float | None = None
        self._timed_out: TimeLimit | None = None
        self._status = status or StatusLine(num_instances, enabled=False)
        self._executor = executor
        self._events = events
        self._router = router
        self._num_instances = num_instances
        self._grace = grace
        self._remaining = set(range(num_instances))
        self._pids: dict[int, int] = {}
        #: Each instance's host, as the plan gives it (named in a stop's warnings when it is another host).
        self._hosts: dict[int, HostSpec] = {}
        self._first_failure: Failure | None = None
        self._knock_ons: list[Failure] = []
        #: Instances that left the fabric dying or exiting, in that order (``PeerGone``): on their way out,
        #: though their ``Exited`` may come after the failures of the instances their loss made fail.
        self._gone: list[int] = []
        #: The gone instance a failure waits for, to be named first in its place (``_record_failure``).
        self._cause_awaited: int | None = None
        #: Until when the job waits for that instance's exit before stopping the others (``CAUSE_WAIT_SECONDS``).
        self._cause_deadline: float | None = None
        #: The signals poprun has sent the instances to stop them.
        self._sent: set[int] = set()
        self._stop_signal: int | None = None
        self._stop_signal_time: float | None = None
        self._stopping = False
        self._kill_deadline: float | None = None
        self._reap_deadline: float | None = None
        self._signalled: set[int] = set()
        self._startup_timeout: StartupTimedOut | None = None
        self._console_closed: Stream | None = None
        self._closed_consoles: set[Stream] = set()

    def run(self, instances: Sequence[InstancePlan]) -> JobReport:
        previous = self._install_signal_handlers()
        if self._time_limit is not None:
            self._time_deadline = time.monotonic() + self._time_limit.seconds
        try:
            self._start(instances)
        finally:
            self._restore_signal_handlers(previous)
            self._executor.join(2.0)
            self._executor.cleanup()
            self._status.hide()
            self._router.close()
        if self._first_failure is None and self._knock_ons and self._cause_awaited is not None:
            self._first_failure = self._knock_ons.pop(0)  # (the one awaited did not fail, or was never reported)
        return JobReport(
            self._num_instances,
            self._first_failure,
            tuple(self._knock_ons),
            self._stop_signal,
            frozenset(self._signalled),
            tuple(sorted(self._remaining)),
            dict(self._pids),
            self._startup_timeout,
            self._timed_out,
            self._console_closed,
            self._router.losses(),
        )

    def _start(self, instances: Sequence[InstancePlan]) -> None:
        self._hosts = {instance.index: instance.host for instance in instances}
        try:
            self._executor.start(instances)
        except StartInterrupted as interrupted:
            # The executor stopped and reaped what it had started; the signal is the job's end.
            signum = self._first_signal()
            self._stop_signal = signum
            self._remaining.clear()
            log.warning("received %s while starting instances: %s", signal.Signals(signum).name, interrupted)
            return
        if self._on_started is not None:
            self._on_started()
        self._loop()

    def _first_signal(self) -> int:
        """The signal that interrupted the start (its handler queued it); other events are dropped."""
        while (event := self._events.get(0)) is not None:
            if isinstance(event, SignalReceived):
                return event.signum
        return signal.SIGINT

    # -- the loop ------------------------------------------------------------------
    def _loop(self) -> None:
        while self._remaining:
            event = self._events.get(self._wait())
            if event is None:
                if self._before_deadline():
                    self._status.refresh()  # only the clock moved
                elif not self._on_deadline():
                    return
            elif isinstance(event, Output):
                self._status.hide()
                self._router.write(event)
                self._status.show()
            elif isinstance(event, Exited):
                self._status.hide()
                self._on_exited(event)
                self._status.exited(event.failed)
            elif isinstance(event, Started):
                self._pids[event.instance] = event.pid
                self._status.started()
            elif isinstance(event, SignalReceived):
                self._on_signal(event.signum, event.time)
            elif isinstance(event, HostLost):
                self._on_host_lost(event)
            elif isinstance(event, StartupTimedOut):
                self._on_startup_timeout(event)
            elif isinstance(event, PeerGone):
                self._gone.append(event.instance)
            elif isinstance(event, ConsoleClosed):
                self._on_console_closed(event.stream)

    def _timeout(self) -> float | None:
        deadline = self._reap_deadline or self._kill_deadline or self._next_running_deadline()
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _next_running_deadline(self) -> float | None:
        """Before the stop: the end of the wait for a failure's cause, or of the time limit, whichever is sooner."""
        deadlines = [d for d in (self._cause_deadline, self._time_deadline) if d is not None]
        return min(deadlines) if deadlines else None

    def _wait(self) -> float | None:
        """Until the next deadline, or the status line's next tick of the clock if that is sooner."""
        waits = [w for w in (self._timeout(), self._status.seconds_to_next_tick()) if w is not None]
        return min(waits) if waits else None

    def _before_deadline(self) -> bool:
        timeout = self._timeout()
        return timeout is None or timeout > 0

    def _on_deadline(self) -> bool:
        """The cause awaited did not exit: stop; out of time: stop; the grace period is over: SIGKILL; after
        that, give up on what will not die."""
        if self._awaiting_cause() and self._cause_deadline is not None and time.monotonic() >= self._cause_deadline:
            log.info("instance %s left the fabric but has not exited within %gs: stopping %s", self._cause_awaited,
                     CAUSE_WAIT_SECONDS, named_instances(self._remaining))
            self._begin_stop(signal.SIGTERM)
            return True
        if not self._stopping and self._time_limit is not None:
            self._timed_out = self._time_limit
            log.info("the job ran out of time (%gs): stopping %s",
                     self._time_limit.seconds, named_instances(self._remaining))
            self._begin_stop(self._time_limit.signum)
            return True
        if self._reap_deadline is None:
            log.warning("%s did not stop within %gs: sending SIGKILL", self._named_with_hosts(self._remaining),
                        self._grace)
            self._kill_now()
            return True
        log.error("%s did not exit even after SIGKILL; giving up on them", named_instances(self._remaining))
        return False

    def _named_with_hosts(self, indices: set[int]) -> str:
        """'instances 0, 1', with the other hosts they run on: 'instance 1 (on nodeB)' (a host whose link is cut
        cannot pass our signals on, which the keepalives tell only later)."""
        remote = sorted({str(host) for i in indices if (host := self._hosts.get(i)) is not None and not host.is_local})
        return named_instances(indices) + (f" (on {', '.join(remote)})" if remote else "")

    def _on_exited(self, event: Exited) -> None:
        self._remaining.discard(event.instance)
        self._router.close_instance(event.instance)
        if event.failed:
            failure = Failure(
                event.instance, event.host, event.pid, event.returncode, event.signal, tuple(self._router.tail(event.instance))
            )
            self._record_failure(failure)
        else:
            log.debug("instance %d (pid %d) exited with code 0", event.instance, event.pid)
            if self._on_clean_exit is not None:
                self._on_clean_exit(event.instance, "with code 0")
            if self._awaiting_cause() and event.instance == self._cause_awaited:
                self._first_failure = self._knock_ons.pop(0)  # it succeeded: the failure of its loss is the first
                self._stop_for(self._first_failure)

    def _on_host_lost(self, event: HostLost) -> None:
        log.error("lost %s: %s", event.host, event.reason)
        for index in event.instances:
            if index in self._remaining:
                self._remaining.discard(index)
                self._record_failure(
                    Failure(index, event.host, self._pids.get(index), None, None, tuple(self._router.tail(index)), event.reason)
                )

    def _on_startup_timeout(self, event: StartupTimedOut) -> None:
        """The root cause when it comes first: what instances do next are knock-ons."""
        if self._stopping:
            return
        self._startup_timeout = event
        self._begin_stop(signal.SIGTERM)

    def _on_console_closed(self, stream: Stream) -> None:
        """Nobody reads poprun's stdout or stderr any more: stop, as a pipeline expects (exit 141)."""
        if stream in self._closed_consoles:
            return
        self._closed_consoles.add(stream)
        self._router.console_closed(stream)
        log_to_open_stream(stream)
        if self._stopping:
            log.debug("poprun's %s was closed while the instances were being stopped", stream)
            return
        self._console_closed = stream
        log.error("poprun's %s was closed (its reader went away, as with `| head`): stopping %s",
                  stream, counted(len(self._remaining), "instance"))
        self._begin_stop(signal.SIGTERM)

    def _record_failure(self, failure: Failure) -> None:
        """The first failure stops the job. One that comes while an instance that left the fabric first (it died,
        or its program ended) is still to be reported is that loss's knock-on: the job waits (at most
        ``CAUSE_WAIT_SECONDS``) for the one that left, and names it first if it failed (its process may take
        longer to be reaped than its peers take to fail of its loss; stopped now, it would die of our signal)."""
        if self._stopping:
            self._record_failure_while_stopping(failure)
            return
        if self._awaiting_cause():
            if failure.instance == self._cause_awaited:
                self._first_failure = failure
                self._stop_for(failure)
            else:
                self._knock_ons.append(failure)
            return
        cause = self._left_before(failure.instance)
        if cause is not None:
            log.info("instance %d failed after instance %d left the fabric: waiting up to %gs for instance %d's "
                     "exit", failure.instance, cause, CAUSE_WAIT_SECONDS, cause)
            self._cause_awaited = cause
            self._cause_deadline = time.monotonic() + CAUSE_WAIT_SECONDS
            self._knock_ons.append(failure)
            return
        self._first_failure = failure
        self._stop_for(failure)

    def _left_before(self, instance: int) -> int | None:
        """The first instance still unreported that left the fabric before ``instance`` did (if it did: a peer
        failing of a loss leaves too, at its exit), whose loss ``instance``'s failure may be a knock-on of."""
        earlier = self._gone[:self._gone.index(instance)] if instance in self._gone else self._gone
        return next((i for i in earlier if i in self._remaining), None)

    def _awaiting_cause(self) -> bool:
        """A failure came after an instance left the fabric, and the job waits for that one's exit, not stopping."""
        return self._cause_awaited is not None and self._first_failure is None and not self._stopping

    def _record_failure_while_stopping(self, failure: Failure) -> None:
        if self._first_failure is None and failure.instance == self._cause_awaited:
            if failure.signal is not None and failure.signal in self._sent and failure.instance in self._signalled:
                # it died of our stop (the wait for it was over, or a signal came): it was alive when it left the
                # fabric, so the failure that came first is first after all
                self._first_failure = self._knock_ons.pop(0)
                self._knock_ons.append(failure)
            else:
                self._first_failure = failure
        else:
            self._knock_ons.append(failure)

    def _stop_for(self, failure: Failure) -> None:
        """Stop the instances still running: ``failure`` is the job's first."""
        if self._remaining:
            log.info("instance %d failed: stopping the other %s", failure.instance,
                     counted(len(self._remaining), "instance"))
        self._begin_stop(signal.SIGTERM)

    def _on_signal(self, signum: int, received: float | None = None) -> None:
        name = signal.Signals(signum).name
        if signum in FORWARDED_SIGNALS:
            if self._stopping:
                log.info("received %s while stopping: not passed on", name)
                return
            log.info("received %s: passed on to %s", name, named_instances(self._executor.signal_all(signum)))
            return
        received = time.monotonic() if received is None else received
        first = self._stop_signal_time
        if self._stopping and first is not None and signum == self._stop_signal and \
                received - first < REPEAT_WINDOW_SECONDS:
            log.info("%s again %.3fs after the first: taken as the same one (a second one after %gs kills at once)",
                     name, received - first, REPEAT_WINDOW_SECONDS)
            return
        if self._stopping:
            log.warning("%s again: killing the instances now", name)
            self._kill_now()
            return
        self._stop_signal, self._stop_signal_time = signum, received
        # Any stop signal again (after the repeat window) kills at once; Ctrl-C is how a terminal sends one.
        again = "press Ctrl-C again" if signum == signal.SIGINT else f"send {name} again"
        log.warning("received %s: stopping %s (SIGKILL in %gs; %s to kill at once)",
                    name, counted(len(self._remaining), "instance"), self._grace, again)
        self._begin_stop(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _begin_stop(self, signum: int) -> None:
        self._stopping = True
        self._sent.add(signum)
        self._signalled.update(self._executor.signal_all(signum))
        self._kill_deadline = time.monotonic() + self._grace

    def _kill_now(self) -> None:
        self._stopping = True
        self._sent.add(signal.SIGKILL)
        self._signalled.update(self._executor.kill_all())
        self._reap_deadline = time.monotonic() + REAP_AFTER_KILL_SECONDS

    # -- signals ------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, signal._HANDLER]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, signal._HANDLER] = {}
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, self._on_signal_received)
        for signum in FORWARDED_SIGNALS:
            previous[signum] = signal.signal(signum, self._on_forwarded_signal)
        if self._status.enabled:
            previous[SUSPEND_SIGNAL] = signal.signal(SUSPEND_SIGNAL, self._on_suspend_signal)
        return previous

    def _on_signal_received(self, signum: int, _frame: object) -> None:
        """A signal handler: queue the signal; a start in progress stops spawning at once."""
        self._events.put(SignalReceived(signum, time.monotonic()))
        self._executor.stop_starting()

    def _on_suspend_signal(self, _signum: int, _frame: object) -> None:
        """A signal handler (Ctrl-Z): ``StatusLine.suspend``, here and now.

        Not an event for the loop, as the other signals are: the stop must happen now, even while the loop
        is blocked writing to a pager that the same Ctrl-Z stopped (``poprun ... | less``), which an event
        queued behind the output would wait for forever. Handlers run in the main thread between two of its
        steps, and the line is on screen (``on_screen``) only while the loop writes nothing else, so erasing
        and drawing it from here cannot cut into output.
        """
        self._status.suspend(SUSPEND_SIGNAL)

    def _on_forwarded_signal(self, signum: int, _frame: object) -> None:
        """A signal handler: queue the signal, to pass on (a start in progress goes on)."""
        self._events.put(SignalReceived(signum, time.monotonic()))

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, signal._HANDLER]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

