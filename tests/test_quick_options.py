"""A plain command line is read without Typer, exactly as Typer reads it; any other goes to Typer.

``poprun_py.quick_options`` reads a launch's options from a table instead of
importing Typer (issue 19: the launch of ``true`` within 2x mpirun's). These
tests hold it to the Typer definition in ``cli.py``: the table is the one
Typer's definition gives, every command line it reads is read as Typer reads
it (the same options, values, order, program), and what it does not know
is left to Typer (with Typer's errors and help).
"""

from __future__ import annotations

import shlex

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poprun_py import cli, quick_options
from poprun_py.errors import UsageError
from poprun_py.quick_options import quick_command_line
from test_cli import GUIDE_LINES

COMMAND = typer.main.get_command(cli.app)


def typer_reads(argv: list[str]) -> object:
    """What Typer's parse gives (a ``CommandLine`` or an exit code), or the exception it raises, as a value."""
    try:
        return cli.parse_command_line(argv)
    except (typer.TyperException, UsageError) as exc:
        return (type(exc), str(exc))


def quick_reads(argv: list[str]) -> object:
    try:
        return quick_command_line(argv)
    except UsageError as exc:
        return (UsageError, str(exc))


def same_reading(quick: object, typer_line: object) -> bool:
    """Equal, ``given`` in the same order too (a saved config keeps it)."""
    if quick != typer_line:
        return False
    return not isinstance(quick, cli.CommandLine) or list(quick.given) == list(typer_line.given)  # type: ignore[attr-defined]


def test_the_table_is_the_one_typers_definition_gives() -> None:
    assert quick_options.OPTIONS == cli.option_table(), (
        "cli.py's options changed: set quick_options.OPTIONS to cli.option_table(), which is\n"
        + "\n".join(f"    {row!r}," for row in cli.option_table()))
    options = [param for param in COMMAND.params if param.param_type_name == "option"]
    valueless = [param for param in options if param.is_flag or param.count]
    assert sorted(quick_options.BOOLEANS) == sorted(
        flag for param in options if param not in valueless and param.metavar == cli._BOOL for flag in param.opts)
    assert sorted(quick_options.VALUED) == sorted(
        flag for param in options if param not in valueless and param.metavar != cli._BOOL for flag in param.opts)
    assert quick_options.SHORT_FLAGS == {"-h": False, **{flag: bool(param.count) for param in valueless
                                                         for flag in param.opts if flag[1:2] != "-"}}


PLAIN = [
    *GUIDE_LINES.values(),
    "poprun --offline-mode=1 --num-instances 2 --num-replicas 2 true",
    "poprun --offline-mode --num-instances 2 --num-replicas 2 python3 train.py --num-instances 9 -v",
    "poprun -H a,b --host=c -H node[01-04] --num-replicas 4 -vv --timeout 3600 --tag-output prog",
    "poprun -v --verbose --vv --stop-grace=0.5 --fabric-timeout 10 --startup-timeout 60.25 prog",
    "poprun --dry-run -H a,b --num-instances 4 --num-replicas 8 -- python3 train.py",
    "poprun --num-instances 2 --num-instances=3 --mpi-global-args=--tag-output --mpi-global-args=-x prog",
    "poprun --tag-output false",
    "poprun --tag-output no prog",
    "poprun --export-config run.json --overwrite-config --import-config=old.json",
    "poprun --host= --vipu-server-host [::1]:8090 --vipu-partition p --compat-imports=no - x",
    "poprun --only-output-from-instance 007 --ipus-per-replica 2 --num-ilds 1 prog",
    "poprun",
    "poprun --",
]


@pytest.mark.parametrize("command", PLAIN)
def test_a_plain_command_line_is_read_as_typer_reads_it(command: str) -> None:
    argv = shlex.split(command)[1:]
    quick = quick_command_line(argv)
    assert quick is not None, "a plain command line went to Typer: the launch pays for importing it"
    assert same_reading(quick, typer_reads(argv)), (quick, typer_reads(argv))


NOT_PLAIN = [
    "--help", "-h", "--version", "-vh", "--num-instances 2 --help prog", "--no-such-option prog",
    "--num-instances x prog", "--num-instances -1 prog", "--num-instances=+2 prog", "--num-instances ２ prog",
    "--num-instances 1_000 prog", "--timeout 1e3 prog", "--timeout .5 prog", "--timeout 5. prog",
    "--timeout nan prog", "--host", "--host -x prog", "-Hnode1 prog", "--vv=1 prog", "-vx prog",
    "--verbose=2 prog", "--mpi-global-args --tag-output prog",
]


@pytest.mark.parametrize("command", NOT_PLAIN)
def test_any_other_command_line_goes_to_typer(command: str) -> None:
    assert quick_reads(shlex.split(command)) is None


def test_typer_says_what_is_wrong_and_the_exit_code_is_the_usage_one(capsys: pytest.CaptureFixture[str]) -> None:
    from poprun_py.command import main
    from poprun_py.errors import EXIT_USAGE

    assert main(["--num-instances", "x", "true"]) == EXIT_USAGE
    assert "Invalid value for '--num-instances': 'x' is not a valid int" in capsys.readouterr().err


def test_a_habit_is_refused_by_the_quick_reading_as_by_typers() -> None:
    """``expand_bare_flags`` runs first in both: ``-np 2`` is the same one line either way."""
    argv = ["-np", "2", "prog"]
    assert quick_reads(argv) == typer_reads(argv)
    assert quick_reads(argv)[0] is UsageError  # type: ignore[index]


FLAGS = [flag for _, flags, kind in quick_options.OPTIONS if kind != "eager" for flag in flags]
WORDS = st.sampled_from(["2", "0", "07", "3.5", "yes", "no", "false", "1", "a,b", "", "-", "--", "-v", "-vv",
                         "-x", "x=1", "python3", "１", "1e3", ".5", "--tag-output", "-H", "-np"])
TOKENS = st.one_of(
    st.sampled_from(FLAGS),
    st.builds(lambda flag, word: f"{flag}={word}", st.sampled_from(FLAGS), WORDS),
    WORDS,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TOKENS, max_size=8))
def test_whatever_the_quick_reading_takes_typer_reads_the_same(argv: list[str]) -> None:
    quick = quick_reads(argv)
    if quick is not None:
        assert same_reading(quick, typer_reads(argv)), (argv, quick, typer_reads(argv))
