"""How a job ended (``JobReport``, its ``Failure``s), as the supervisor (``job.Job``) makes it, and the
end-of-job summary: the first failure named, knock-ons apart."""

from __future__ import annotations

import logging
import signal
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, NamedTuple

from .errors import EXIT_BROKEN_PIPE, EXIT_OUTPUT_LOST, EXIT_STARTUP_TIMEOUT, EXIT_TIMEOUT
from .ranges import counted, format_indices, format_seconds, named_instances

if TYPE_CHECKING:
    from .events import StartupTimedOut, Stream
    from .job import TimeLimit
    from .writers import OutputLoss

log = logging.getLogger("poprun")


class Failure(NamedTuple):
    """A failed instance, as the summary shows it. (This and ``JobReport`` are named tuples, not frozen
    dataclasses: their classes are made at every launch, about 6x faster, see ``events``.)"""

    instance: int
    host: str
    pid: int | None
    returncode: int | None
    signal: int | None
    stderr_tail: tuple[str, ...]
    lost_reason: str | None = None

    @property
    def exit_code(self) -> int:
        if self.signal is not None:
            return 128 + self.signal
        return self.returncode if self.returncode is not None else 1


class JobReport(NamedTuple):
    """How a job ended: the first failure, the knock-ons, or the signal that stopped it."""

    num_instances: int
    first_failure: Failure | None
    knock_ons: tuple[Failure, ...]
    stopped_by_signal: int | None
    signalled: frozenset[int]
    unreaped: tuple[int, ...] = ()
    pids: Mapping[int, int] = MappingProxyType({})
    startup_timeout: StartupTimedOut | None = None
    timed_out: TimeLimit | None = None  # the job ran out of time and was stopped
    console_closed: Stream | None = None  # poprun's stdout/stderr lost its reader and that stopped the job
    output_lost: tuple[OutputLoss, ...] = ()  # files (or a console) that did not get all their bytes

    @property
    def exit_code(self) -> int:
        """What stopped the job first decides; lost output only turns a success into 80."""
        if self.startup_timeout is not None:
            return EXIT_STARTUP_TIMEOUT
        if self.timed_out is not None:
            return EXIT_TIMEOUT
        if self.first_failure is not None:
            return self.first_failure.exit_code
        if self.stopped_by_signal is not None:
            return 128 + self.stopped_by_signal
        if self.console_closed is not None:
            return EXIT_BROKEN_PIPE
        if self.output_lost:
            return EXIT_OUTPUT_LOST
        return 0

#: What a signal most often means when it ends an instance.
LIKELY_CAUSES: dict[int, str] = {
    signal.SIGKILL: "killed, often by the out-of-memory killer (see dmesg)",
    signal.SIGSEGV: "a segmentation fault: a crash in native code",
    signal.SIGABRT: "aborted: a failed assertion or abort() in native code",
    signal.SIGBUS: "a bus error: often /dev/shm or a memory-mapped file ran out of space",
    signal.SIGFPE: "an arithmetic error in native code",
    signal.SIGILL: "an illegal instruction: a binary built for another CPU",
    signal.SIGTERM: "terminated from outside poprun",
    signal.SIGINT: "interrupted",
    signal.SIGPIPE: "it wrote to a pipe nobody reads",
}
EXIT_CODE_CAUSES = {
    126: "the shell could not execute a command",
    127: "the shell could not find a command",
    137: "128+9: the program reports it was killed, often out of memory",
}
TAIL_LINES = 10


def describe_failure(failure: Failure) -> str:
    """'exited with code 3' / 'was killed by SIGKILL (signal 9): killed, often ...'."""
    if failure.lost_reason is not None:
        return f"was lost: {failure.lost_reason}"
    if failure.signal is not None:
        try:
            name = signal.Signals(failure.signal).name
        except ValueError:
            name = f"signal {failure.signal}"
        cause = LIKELY_CAUSES.get(failure.signal)
        return f"was killed by {name} (signal {failure.signal})" + (f": {cause}" if cause else "")
    cause = EXIT_CODE_CAUSES.get(failure.returncode or 0)
    return f"exited with code {failure.returncode}" + (f" ({cause})" if cause else "")


def summary_lines(report: JobReport) -> list[str]:
    """The lines poprun prints at the end of a job that did not succeed."""
    lines: list[str] = []
    n = report.num_instances
    first = report.first_failure
    if report.startup_timeout is not None:
        # it stopped the job, so every failure after it is a knock-on (first is None)
        lines.append(f"start-up timed out: {report.startup_timeout.message} (see --startup-timeout)")
    if report.timed_out is not None:
        lines.append(f"timed out after {format_seconds(report.timed_out.seconds)}s: poprun stopped the instances")
    if first is not None:
        pid = f"pid {first.pid}" if first.pid is not None else "pid unknown"
        lines.append(f"instance {first.instance} of {n} ({pid} on {first.host}) {describe_failure(first)}")
        if first.stderr_tail:
            lines.append(f"last lines of instance {first.instance}'s stderr:")
            lines.extend(f"  {text}" for text in first.stderr_tail[-TAIL_LINES:])
    elif report.stopped_by_signal is not None:
        lines.append(f"poprun received {signal.Signals(report.stopped_by_signal).name} and stopped the instances")
    elif report.console_closed is not None:
        lines.append(f"poprun's {report.console_closed} was closed, so poprun stopped the instances "
                     f"(exit {EXIT_BROKEN_PIPE}, 128+SIGPIPE, as a pipeline expects)")
    # (an instance whose host was lost is not known to have stopped, signalled or not: it is named with its host)
    stopped = sorted(f.instance for f in report.knock_ons if f.instance in report.signalled and f.lost_reason is None)
    independent = [f for f in report.knock_ons if f.instance not in stopped]
    if stopped:
        lines.append(f"instances stopped by poprun as a consequence: {format_indices(stopped)}")
    for failure in independent:
        lines.append(f"also failed: instance {failure.instance} on {failure.host} {describe_failure(failure)}")
    if report.unreaped:
        lines.append(f"{named_instances(report.unreaped)} could not be reaped (uninterruptible sleep?)")
    lines.extend(lost_output_lines(report))
    return lines


def lost_output_lines(report: JobReport) -> list[str]:
    """One line per destination that lost bytes; then what the exit code says about it."""
    if not report.output_lost:
        return []
    lines = [f"output lost: {loss.lost_bytes} bytes were not written to {loss.destination} ({loss.reason})"
             if loss.lost_bytes else f"output lost: {loss.destination} may lack its last bytes ({loss.reason})"
             for loss in report.output_lost]
    if report.exit_code == EXIT_OUTPUT_LOST:
        complete = "" if any(loss.console for loss in report.output_lost) else "; the console shows all the output"
        kind = counted(len(report.output_lost), "output destination" if complete == "" else "output file")
        are = "is" if len(report.output_lost) == 1 else "are"
        lines.append(f"every instance succeeded, but {kind} {are} incomplete (exit {EXIT_OUTPUT_LOST}){complete}")
    return lines


def log_report(report: JobReport) -> None:
    if report.exit_code == 0:
        log.info("all %d instances exited with code 0", report.num_instances)
        return
    for line in summary_lines(report):
        log.error("%s", line)
    log.info("poprun exits with code %d", report.exit_code)
