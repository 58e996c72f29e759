"""The event vocabulary every executor speaks to the supervisor.

Executors (local, ssh agent, srun agent) reach the job only through these
frozen records on one queue, so the supervisor never needs to know where an
instance runs. They are named tuples, not dataclasses: a launch defines them
all, and a named tuple's class is made about 6x faster than a frozen
dataclass's (which compiles six methods), about 1 ms each on this host's
Python 3.11 at every start; nothing compares or hashes events.
"""

from __future__ import annotations

import queue
import threading
from typing import Literal, NamedTuple, Union

Stream = Literal["stdout", "stderr"]


class Started(NamedTuple):
    """An instance's process exists and runs the program."""

    instance: int
    pid: int
    host: str


class Output(NamedTuple):
    """Raw bytes an instance wrote; never decoded, never split into lines here."""

    instance: int
    stream: Stream
    data: bytes


class Exited(NamedTuple):
    """An instance's process has been reaped and all its output delivered.

    Exactly one of ``returncode`` (normal exit) and ``signal`` (killed) is set.
    ``time`` is ``time.monotonic()`` at reaping, to order failures.
    """

    instance: int
    pid: int
    host: str
    returncode: int | None
    signal: int | None
    time: float

    @property
    def failed(self) -> bool:
        return self.signal is not None or self.returncode != 0

    @property
    def exit_code(self) -> int:
        """The shell's convention: the code, or 128 + signal number."""
        return 128 + self.signal if self.signal is not None else int(self.returncode or 0)


class HostLost(NamedTuple):
    """The channel to a host closed before its instances reported their exits."""

    host: str
    instances: tuple[int, ...]
    reason: str


class StartupTimedOut(NamedTuple):
    """Some instances did not join the job's fabric in time (the rendezvous says which)."""

    missing: tuple[int, ...]
    message: str


class PeerGone(NamedTuple):
    """The job's fabric saw an instance leave on its way out: its connection closed without a clean leave (it
    died), or it left as its program ended (``exited``, as the fabric closes at exit, an uncaught exception's
    included). Its ``Exited`` follows, on its own time, and the instances in a collective with it fail of that."""

    instance: int


class SignalReceived(NamedTuple):
    """The launcher received a signal (turned into an event on the main loop)."""

    signum: int
    time: float  # when the handler ran (time.monotonic()): repeats are told apart by it


class ConsoleClosed(NamedTuple):
    """The reader of poprun's stdout or stderr went away (``| head``): the job stops, exit 141."""

    stream: Stream


class StartInterrupted(Exception):
    """A signal reached the launcher while it was starting instances: it stopped what it had started."""

    def __init__(self, started: int, planned: int) -> None:
        super().__init__(f"stopped after starting {started} of {planned} instances")
        self.started = started
        self.planned = planned


Event = Union[Started, Output, Exited, HostLost, StartupTimedOut, PeerGone, SignalReceived, ConsoleClosed]


class EventQueue:
    """The one queue from executors to the supervisor.

    ``put`` is safe from signal handlers (``SimpleQueue.put`` is reentrant);
    ``put_output`` blocks once too much output is pending, so a slow console
    slows the instances down instead of growing memory without bound.
    """

    def __init__(self, max_pending_output: int = 1024) -> None:
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._budget = threading.Semaphore(max_pending_output)

    def put(self, event: Event) -> None:
        self._queue.put(event)

    def put_output(self, event: Output) -> None:
        self._budget.acquire()
        self._queue.put(event)

    def get(self, timeout: float | None) -> Event | None:
        """The next event, or None when ``timeout`` seconds pass without one."""
        try:
            event = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(event, Output):
            self._budget.release()
        return event
