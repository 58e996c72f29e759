"""The ``poprun`` command: argv -> ``CommandLine`` -> ``LaunchSpec`` -> launch -> exit code.

Nothing else lives here: every error a user can cause becomes one line on
stderr and the exit code of its category (see ``errors.py``).

The command's options are defined once, with Typer, in ``cli.py``. A plain
command line (``quick_options``: every option known, every value
well-formed, no ``--help``) is read from the table Typer's definition gives,
without importing Typer: its import was a fifth of a launch of ``true``.
Anything else, every usage error included, is Typer's to parse and to say.
"""

from __future__ import annotations

import logging
import shutil
import sys
from typing import Any

from .command_line import CommandLine, one_line
from .console import quiet_closed_streams, say
from .errors import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, InterruptedAndLogged, PoprunError, UsageError
from .logs import configure_logging
from .quick_options import quick_command_line
from .spec import MERGED_LISTS, LaunchSpec, build_spec, load_config, merge_options, parse_bool, save_config
from .validate import option_flag

log = logging.getLogger("poprun")


def main(argv: list[str] | None = None) -> int:
    """Entry point: never a traceback for a user's mistake, always a distinct exit code."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        quiet_closed_streams()


def _main(args: list[str]) -> int:
    try:
        line = parse(args)
        if not isinstance(line, CommandLine):
            return line
        return _launch(line)
    except PoprunError as exc:
        say(f"poprun: error: {one_line(str(exc))}", *(f"  {one_line(line)}" for line in exc.details))
        return exc.exit_code
    except InterruptedAndLogged:
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        say("poprun: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # poprun's own output (the topology, say) lost its reader: as a pipeline expects
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug: one line, the traceback only with --vv
        log.debug("internal error", exc_info=True)
        say(f"poprun: internal error: {type(exc).__name__}: {exc} (run with --vv for the traceback)")
        return EXIT_INTERNAL


def parse(args: list[str]) -> CommandLine | int:
    """The command line from the option table when it is a plain one, else from Typer (``cli.parse``); an int
    is an exit code (``--help``, ``--version``, a usage error Typer has said)."""
    line = quick_command_line(args)
    if line is not None:
        return line
    from .cli import parse as parse_with_typer

    return parse_with_typer(args)


def resolve_launch(line: CommandLine) -> LaunchSpec | None:
    """Merge a config file under the command line and validate; save the launch if asked.

    Returns no spec when there is nothing to run (only ``--export-config``).
    """
    _refuse_empty(("--import-config", line.import_config), ("--export-config", line.export_config))
    options, program = dict(line.given), list(line.program)
    file_options: dict[str, Any] = {}
    if line.import_config is not None:
        file_options, file_program = load_config(line.import_config)
        options = merge_options(file_options, line.given)
        program = program or file_program
    configure_logging(2 if options.get("vv") else int(options.get("verbose") or 0))
    try:
        spec = build_spec(options, program)
    except UsageError as exc:
        _name_the_config(exc, line, file_options)
        raise
    if program and not program[0]:  # ("$PROGRAM" unset): not the current directory, "a directory" as before
        raise UsageError("the program's name is empty (an unset variable?); usage: poprun [options] program "
                         "[program args]")
    if line.export_config is not None:
        save_config(line.export_config, options, program, parse_bool("overwrite_config", line.overwrite_config or "no"))
        if not program:
            return None
    if not program:
        raise UsageError("no program given; usage: poprun [options] program [program args]" + _swallowed_hint(line))
    return spec


def _name_the_config(exc: UsageError, line: CommandLine, file_options: dict[str, Any]) -> None:
    """A bad value read from ``--import-config`` is said with the file's name: the user would look for it on the
    command line. (The checks name the option first, ``--timeout: ...``, which is how it is recognised.)"""
    flag = str(exc).partition(":")[0]
    from_file = {option_flag(name) for name in file_options if name not in line.given or name in MERGED_LISTS}
    if line.import_config is not None and flag in from_file:
        exc.args = (f"{exc} (in --import-config {line.import_config!r})",)


def _swallowed_hint(line: CommandLine) -> str:
    """When a bare yes/no option took the program for its value (``--tag-output false``), say how to write it."""
    if line.swallowed is None:
        return ""
    flag, word = line.swallowed
    if shutil.which(word) is None:  # 'on', 'y', '1': not a program anyone meant
        return ""
    return f" (did you mean the program {word!r}? write {flag}=yes {word})"


def _refuse_empty(*values: tuple[str, str | None]) -> None:
    """A file option given an empty value (``--export-config ""``, an unset variable) is a mistake, not "no file"."""
    for flag, value in values:
        if value is not None and not value.strip():
            raise UsageError(f"{flag}: the value is empty; name a file")


def _launch(line: CommandLine) -> int:
    spec = resolve_launch(line)
    if spec is None:
        return 0
    if line.dry_run is not None and parse_bool("dry_run", line.dry_run):
        from .dryrun import dry_run

        return dry_run(spec)
    # The guardian is a Python process of its own: started before the launcher's modules load, its
    # start-up runs on another core meanwhile, instead of competing with the instances' (~10 ms).
    from .executors.guardian import Guardian

    guardian = Guardian(spec.supervision.stop_grace)
    try:
        from .launcher import run_launch  # imported late: --help and usage errors stay fast

        return run_launch(spec, guardian)
    finally:
        guardian.close()
