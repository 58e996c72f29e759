"""Error categories a user can cause, each with its own exit code.

The CLI maps these to one line on stderr and the code below; nothing else
in the launcher decides exit codes. Every ``EXIT_*`` name here is one
category and no two share a code (a test holds that), so a script can tell
a start-up timeout from a job time limit, or lost output from success.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in poprun; run with --vv for the traceback
EXIT_NO_DEVICES = 69  # EX_UNAVAILABLE: no IPUs to allocate (and not --offline-mode)
EXIT_PARTITION_TOO_LARGE = 72  # the partition asked for is larger than the V-IPU cluster
EXIT_PARTITION_MISMATCH = 73  # an existing partition does not fit the launch (no --update-partition)
EXIT_VIPU_UNREACHABLE = 74  # the V-IPU server does not answer
EXIT_PARTITION_FAILED = 76  # the partition is in a failed state after create/reset
EXIT_VIPU_ERROR = 77  # any other refusal by the V-IPU service
EXIT_PREFLIGHT = 75  # a host failed its pre-flight checks
EXIT_STARTUP_TIMEOUT = 79  # instances did not join the fabric within --startup-timeout
EXIT_OUTPUT_LOST = 80  # nothing else failed, but writing some output (a file, poprun's own console) lost bytes
EXIT_TIMEOUT = 124  # the job ran out of time (a time limit; like timeout(1))
EXIT_NOT_EXECUTABLE = 126  # the program exists but cannot be executed
EXIT_NOT_FOUND = 127  # the program does not exist
EXIT_INTERRUPTED = 130  # 128+SIGINT: stopped by Ctrl-C before or while the instances ran
EXIT_BROKEN_PIPE = 141  # 128+SIGPIPE: poprun's stdout or stderr was closed (e.g. `| head`)


def exit_codes() -> dict[str, int]:
    """Every category's name and code: the one registry (the README's table and the tests read it)."""
    return {name: value for name, value in globals().items() if name.startswith("EXIT_") and isinstance(value, int)}


#: What each exit code tells a user, in one line (``poprun --help`` lists them; a test holds every code to one).
_MEANINGS = {
    "EXIT_OK": "every instance exited with code 0",
    "EXIT_USAGE": "bad options or arguments, or a setting such as XDG_STATE_HOME",
    "EXIT_INTERNAL": "a bug in poprun (run with --vv for the traceback)",
    "EXIT_NO_DEVICES": "no free IPUs for the partition",
    "EXIT_PARTITION_TOO_LARGE": "the partition is larger than the V-IPU cluster",
    "EXIT_PARTITION_MISMATCH": "the partition does not fit the launch (see --update-partition)",
    "EXIT_VIPU_UNREACHABLE": "the V-IPU server does not answer",
    "EXIT_PARTITION_FAILED": "the partition is in a failed state",
    "EXIT_VIPU_ERROR": "the V-IPU service refused a request",
    "EXIT_PREFLIGHT": "a host failed its pre-flight checks",
    "EXIT_STARTUP_TIMEOUT": "instances did not join within --startup-timeout",
    "EXIT_OUTPUT_LOST": "output lost: a file or poprun's stdout/stderr not written whole",
    "EXIT_TIMEOUT": "the job ran out of time (--timeout)",
    "EXIT_NOT_EXECUTABLE": "the program cannot be executed",
    "EXIT_NOT_FOUND": "the program does not exist",
    "EXIT_INTERRUPTED": "stopped by Ctrl-C (SIGINT)",
    "EXIT_BROKEN_PIPE": "poprun's stdout or stderr was closed",
}


def exit_code_meanings() -> dict[int, str]:
    """Code -> one line saying what it means; a category without its line says so rather than vanish."""
    return {code: _MEANINGS.get(name, name.removeprefix("EXIT_").replace("_", " ").lower())
            for name, code in sorted(exit_codes().items(), key=lambda item: item[1])}


class PoprunError(Exception):
    """An error with a message a user can act on and a distinct exit code."""

    exit_code: int = EXIT_INTERNAL
    details: tuple[str, ...] = ()  # further lines, one fact each (e.g. a verdict per host)


class UsageError(PoprunError):
    """Bad options or arguments: say what is wrong and how to fix it."""

    exit_code = EXIT_USAGE


class ProgramNotFound(PoprunError):
    exit_code = EXIT_NOT_FOUND


class ProgramNotExecutable(PoprunError):
    exit_code = EXIT_NOT_EXECUTABLE


class DevicesUnavailable(PoprunError):
    exit_code = EXIT_NO_DEVICES


class PartitionTooBig(PoprunError):
    exit_code = EXIT_PARTITION_TOO_LARGE


class PartitionMismatch(PoprunError):
    exit_code = EXIT_PARTITION_MISMATCH


class VipuServerUnreachable(PoprunError):
    exit_code = EXIT_VIPU_UNREACHABLE


class PartitionFailed(PoprunError):
    exit_code = EXIT_PARTITION_FAILED


class VipuServiceError(PoprunError):
    exit_code = EXIT_VIPU_ERROR


class PreflightFailed(PoprunError):
    """Some hosts cannot run instances: one verdict per host, naming the stage that failed."""

    exit_code = EXIT_PREFLIGHT

    def __init__(self, message: str, verdicts: tuple[str, ...]) -> None:
        super().__init__(message)
        self.details = verdicts


class OwnOutputLost(PoprunError):
    """poprun's own output (``--dry-run``, ``--print-topology``, ``--help``) could not be written whole."""

    exit_code = EXIT_OUTPUT_LOST


class InterruptedAndLogged(KeyboardInterrupt):
    """A Ctrl-C whose line poprun's log has written already (what was stopped): the CLI adds none of its own."""
