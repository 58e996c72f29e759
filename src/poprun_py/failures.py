"""How a launch of Python functions failed: one exception, every failed instance in it.

An instance never sends its exception object back (it may not unpickle, and
its traceback cannot); it sends a ``RemoteError``: the type's name, the
message and the traceback as text. ``InstancesFailed`` puts the first failure
first, then the others, and names apart the instances that were only stopped
because of it (torch's ``ChildFailedError`` root cause vs the rest).
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass

from .ranges import format_indices, format_seconds

#: ``RemoteError.outcome`` values: an ordinary exception, or pytest's skip and xfail raised in an instance.
ERROR, SKIP, XFAIL = "error", "skip", "xfail"


@dataclass(frozen=True)
class RemoteError:
    """The exception that ended a function in an instance, as text."""

    type_name: str  # "AssertionError", "simipu.fabric.errors.PeerLostError"
    message: str  # str(exception): for a failed assert, pytest's explanation
    traceback: str  # Python's traceback, or pytest's report of the failure (the plugin renders it)
    outcome: str = ERROR  # SKIP or XFAIL for pytest.skip() / pytest.xfail() called in the instance
    where: tuple[str, int] | None = None  # file and line that raised it, for pytest's skip report

    @property
    def summary(self) -> str:
        """'AssertionError: assert 1 == 2': the type and the first line of the message."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type_name}: {first}" if first else self.type_name


def type_name(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def outcome_of(exc: BaseException) -> str:
    """SKIP or XFAIL for pytest's own outcome exceptions (only if pytest is loaded: then it may be one)."""
    pytest = sys.modules.get("pytest")
    if pytest is None:
        return ERROR
    if isinstance(exc, pytest.skip.Exception):
        return SKIP
    if isinstance(exc, pytest.xfail.Exception):
        return XFAIL
    return ERROR


def raised_at(exc: BaseException) -> tuple[str, int] | None:
    """File and line of the last frame that does not hide itself (``__tracebackhide__``, as pytest.skip does)."""
    where = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if not frame.f_locals.get("__tracebackhide__", False):
            where = (frame.f_code.co_filename, line)
    return where


def describe_exception(exc: BaseException) -> RemoteError:
    """The default description: the qualified type name and Python's own traceback text."""
    outcome = outcome_of(exc)
    message = getattr(exc, "msg", None) if outcome != ERROR else None  # pytest's outcomes keep the reason in .msg
    return RemoteError(type_name(exc), str(message if message is not None else exc),
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), outcome, raised_at(exc))


@dataclass(frozen=True)
class InstanceFailure:
    """One failed instance: what it raised, or how its process ended, and its stacks if it hung."""

    index: int
    num_instances: int
    host: str
    pid: int | None
    how: str  # "raised ValueError: boom", "exited with code 3", "timed out"
    error: RemoteError | None = None
    stacks: str | None = None  # faulthandler's dump of its threads, when the time limit stopped it
    stderr_tail: tuple[str, ...] = ()  # the end of its stderr, when it left no Python traceback

    @property
    def skipped(self) -> bool:
        """It called ``pytest.skip`` or ``pytest.xfail``: not a failure of its own."""
        return self.error is not None and self.error.outcome in (SKIP, XFAIL)

    @property
    def heading(self) -> str:
        """'instance 2 of 4 raised ValueError: boom (pid 123 on localhost)': what matters first,
        since pytest's one-line summary shows only the start."""
        pid = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return f"instance {self.index} of {self.num_instances} {self.how} ({pid} on {self.host})"

    @property
    def details(self) -> str:
        if self.error is not None:
            return self.error.traceback.rstrip("\n")
        if self.stacks is not None:
            return self.stacks.rstrip("\n")
        if self.stderr_tail:
            return "last lines of its stderr:\n" + "\n".join(f"  {line}" for line in self.stderr_tail)
        return ""


class InstancesFailed(Exception):
    """Instances of a ``poprun_py.launch`` failed; every other instance was stopped.

    ``failures`` puts the first failure first, and instances that called
    ``pytest.skip``/``xfail`` after every real failure; ``stopped`` lists the
    instances that were stopped because of it. The message is ``describe()`` in full.
    """

    def __init__(
        self,
        failures: tuple[InstanceFailure, ...],
        stopped: tuple[int, ...],
        num_instances: int,
        timed_out: float | None = None,
        note: str | None = None,
    ) -> None:
        self.failures = failures
        self.stopped = stopped
        self.num_instances = num_instances
        self.timed_out = timed_out
        self.note = note
        super().__init__(self.describe())

    @property
    def first(self) -> InstanceFailure | None:
        return self.failures[0] if self.failures else None

    def describe(self, first_only: bool = False) -> str:
        """Every failure with its traceback, or (``first_only``) the first in full and one line per other.

        Hung instances' stacks are always in full: they are the point of a time limit.
        """
        lines: list[str] = []
        if self.timed_out is not None:
            hung = [f.index for f in self.failures if f.stacks is not None]
            after = f"timed out after {format_seconds(self.timed_out)}s"
            lines.append(f"{after}; the stacks of the instances still running ({format_indices(hung)}) follow" if hung
                         else after)
        if self.note:
            lines.append(self.note)
        for number, failure in enumerate(self.failures):
            if number == 0 or not first_only or failure.stacks is not None:
                lines.append(failure.heading)
                if failure.details:
                    lines.append(failure.details)
            else:
                lines.append(f"{'also' if failure.skipped else 'also failed'}: {failure.heading}")
        if self.stopped:
            lines.append(f"stopped as a consequence: instances {format_indices(self.stopped)}")
        return "\n".join(lines)
