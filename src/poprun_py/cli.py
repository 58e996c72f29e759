"""The ``poprun`` command's options, defined with Typer, and the parse of any command line by Typer.

``command.py`` runs the command. It reads a plain command line from the
table ``option_table`` derives from this definition (``quick_options``,
kept equal to it by ``tests/test_quick_options.py``); every other one,
``--help``, ``--version`` and every usage error come here.

No ``from __future__ import annotations`` here: Typer reads the options from
``poprun``'s annotations, and real objects spare it evaluating ~50 strings at
every start (~1 ms).
"""

import contextlib
import dataclasses
import os
import sys
from typing import Any, Iterator, Optional

import typer

from . import __version__
from .argv import expand_bare_flags
from .command_line import APART, CommandLine, one_line
from .console import say, stdout_lost_its_reader
from .errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_USAGE, exit_code_meanings
from .quick_options import BOOLEANS, SHORT_FLAGS, VALUED
from .writers import READER_GONE, own_output_lost

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]},
)

_V = "V-IPU"
_OUT = "Output"
_PLACE = "Placement"
_BOOL = "[yes|no]"  # the metavar of every yes/no option: a bare flag means yes (see argv.py)

_EXAMPLES = (
    ("Two instances on this host, no IPUs attached:",
     "poprun --offline-mode --num-instances 2 --num-replicas 2 python3 train.py"),
    ("What a launch on hosts a and b would run, without running it:",
     "poprun --dry-run -H a,b --num-instances 4 --num-replicas 8 python3 train.py"),
    ("At most an hour on hosts a and b, each output line tagged with its instance:",
     "poprun --timeout 3600 --tag-output -H a,b --num-replicas 4 python3 train.py"),
)


def _epilog() -> str:
    """The exit codes (from the one registry) and three examples; \\b keeps click from re-wrapping them."""
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in exit_code_meanings().items())
    examples = "\n".join(f"{what}\n  {line}" for what, line in _EXAMPLES)
    return f"\b\nExit codes (an instance's own code when it fails first):\n{codes}\n\n\b\nExamples:\n{examples}"


def _version(value: bool) -> None:
    if value:
        from .writers import write_own_output

        write_own_output(1, f"poprun (poprun-py) {__version__}\n")
        raise typer.Exit()


@app.command(help="Launch instances of PROGRAM with its ARGS, as Graphcore's PopRun does. PROGRAM comes after "
                  "every poprun option; a yes/no option given bare (--offline-mode) means yes.", epilog=_epilog())
def poprun(
    ctx: typer.Context,
    program: Optional[list[str]] = typer.Argument(None, metavar="PROGRAM [ARGS]...", hidden=True, show_default=False),
    host: Optional[list[str]] = typer.Option(None, "-H", "--host", metavar="HOST[,HOST...]", help="Comma-separated hosts on which to run instances; ranges like node[01-04] work. (default: this host; inside a Slurm allocation, its nodes)"),
    host_file: Optional[str] = typer.Option(None, metavar="FILE", help="A file with one host per line (# comments allowed)."),
    num_replicas: Optional[int] = typer.Option(None, metavar="N", help="The total number of replicas. (default: 1)"),
    ipus_per_replica: Optional[int] = typer.Option(None, metavar="N", help="The number of IPUs per replica. (default: 1)"),
    num_instances: Optional[int] = typer.Option(None, metavar="N", help="The number of instances, in total (mpirun's -np). (default: one per host)"),
    num_ilds: Optional[int] = typer.Option(None, metavar="N", help="The number of IPU-Link domains. (default: 1)"),
    vipu_server_host: Optional[str] = typer.Option(None, metavar="HOST[:PORT]", help="The host of the V-IPU server; IPv6 bare or in brackets. (default: the embedded service)", rich_help_panel=_V),
    vipu_server_port: Optional[int] = typer.Option(None, metavar="PORT", help="The port of the V-IPU server. (default: 8090)", rich_help_panel=_V),
    vipu_server_timeout: Optional[int] = typer.Option(None, metavar="SECONDS", help="Timeout for V-IPU requests. (default: 10)", rich_help_panel=_V),
    vipu_partition: Optional[str] = typer.Option(None, metavar="NAME", help="Create/use this V-IPU partition. (default: the only partition that fits, else a temporary one)", rich_help_panel=_V),
    update_partition: Optional[str] = typer.Option(None, metavar=_BOOL, help="Update the partition if needed. (default: no)", rich_help_panel=_V),
    reset_partition: Optional[str] = typer.Option(None, metavar=_BOOL, help="Reset the partition first. (default: non-reconfigurable ones only)", rich_help_panel=_V),
    remove_partition: Optional[str] = typer.Option(None, metavar=_BOOL, help="Remove a partition poprun created, after the run. (default: yes)", rich_help_panel=_V),
    vipu_cluster: Optional[str] = typer.Option(None, metavar="NAME", help="The V-IPU cluster to create partitions in. (default: the service's)", rich_help_panel=_V),
    vipu_allocation: Optional[str] = typer.Option(None, metavar="NAME", help="The V-IPU allocation to create partitions in: another name for --vipu-cluster (give one of them). (default: the service's)", rich_help_panel=_V),
    vipu_partition_attempts: Optional[int] = typer.Option(None, metavar="N", help="Attempts at creating the partition. (default: 1)", rich_help_panel=_V),
    ipu_link_routing_type: Optional[str] = typer.Option(None, metavar="TYPE", help="IPU-Link routing type of the partition. (default: ringswnc)", rich_help_panel=_V),
    gw_link_routing_type: Optional[str] = typer.Option(None, metavar="TYPE", help="GW-Link routing type of the partition. (default: ring)", rich_help_panel=_V),
    sync_type: Optional[str] = typer.Option(None, metavar="TYPE", help="Sync type of the partition. (default: pod-native-default)", rich_help_panel=_V),
    executable_cache_path: Optional[str] = typer.Option(None, metavar="DIR", help="Directory for the executable cache (created if missing); instances get it as an absolute path in POPDIST_EXECUTABLE_CACHE_PATH. (default: none)"),
    mpi_global_args: Optional[list[str]] = typer.Option(None, metavar="ARGS", help="mpirun options for all instances, e.g. '--timestamp-output'; repeatable.", rich_help_panel=_OUT),
    mpi_local_args: Optional[list[str]] = typer.Option(None, metavar="ARGS", help="Per-instance mpirun options, e.g. '-x VAR=VALUE -x PATH'; repeatable.", rich_help_panel=_OUT),
    instance_mpi_local_args: Optional[list[str]] = typer.Option(None, metavar="INDEX:ARGS", help="Options for one instance, e.g. '1:-x VAR=VALUE'; repeatable.", rich_help_panel=_OUT),
    tag_output: Optional[str] = typer.Option(None, metavar=_BOOL, help="Prefix each output line with [1,<instance>]<stdout>: as mpirun does. (default: no)", rich_help_panel=_OUT),
    numa_aware: Optional[str] = typer.Option(None, metavar=_BOOL, help="Bind instances to NUMA nodes round-robin. (default: yes with several instances per host)", rich_help_panel=_PLACE),
    process_placement: Optional[str] = typer.Option(None, metavar="spreadnuma|disabled", help="How instances are placed on CPUs. (default: spreadnuma)", rich_help_panel=_PLACE),
    print_topology: Optional[str] = typer.Option(None, metavar=_BOOL, help="Print the topology table. (default: no)", rich_help_panel=_OUT),
    only_output_from_instance: Optional[int] = typer.Option(None, metavar="INDEX", help="Show only this instance's output; failures are always shown. (default: all)", rich_help_panel=_OUT),
    offline_mode: Optional[str] = typer.Option(None, metavar=_BOOL, help="Run without requiring or attaching to any IPUs. (default: no)"),
    dry_run: Optional[str] = typer.Option(None, metavar=_BOOL, help="Resolve hosts, placement and partition; print each instance's command, directory and environment; start nothing. (default: no)"),
    timeout: Optional[float] = typer.Option(None, metavar="SECONDS", help="Stop the job after this long, as a failure; exit code 124. (default: none)"),
    import_config: Optional[str] = typer.Option(None, metavar="FILE", help="Read a launch saved with --export-config; command-line values win.", rich_help_panel="Config"),
    export_config: Optional[str] = typer.Option(None, metavar="FILE", help="Save this launch to a file (and run it if a program is given).", rich_help_panel="Config"),
    overwrite_config: Optional[str] = typer.Option(None, metavar=_BOOL, help="Let --export-config replace an existing file. (default: no)", rich_help_panel="Config"),
    allow_run_as_root: Optional[str] = typer.Option(None, metavar=_BOOL, help="Accepted for compatibility; poprun-py runs as any user. (default: no)"),
    stop_grace: Optional[float] = typer.Option(None, metavar="SECONDS", help="Time between SIGTERM and SIGKILL when stopping instances. (default: 5)"),
    fabric_transport: Optional[str] = typer.Option(None, metavar="auto|tcp", help="auto (shared memory/Unix sockets within a host, TCP between) or tcp (TCP everywhere). (default: auto)", rich_help_panel="Fabric"),
    fabric_timeout: Optional[float] = typer.Option(None, metavar="SECONDS", help="After this long a silent peer counts as lost in a collective. (default: 10)", rich_help_panel="Fabric"),
    startup_timeout: Optional[float] = typer.Option(None, metavar="SECONDS", help="Time the instances have to join the fabric once the first has. (default: 60)", rich_help_panel="Fabric"),
    compat_imports: Optional[str] = typer.Option(None, metavar=_BOOL, help="In the instances, 'import horovod' and 'import mpi4py' get poprun-py's implementations over the fabric; no: the installed packages, and a real MPI that sees one process stops the program. (default: yes)"),
    ssh_timeout: Optional[float] = typer.Option(None, metavar="SECONDS", help="Time each remote host has to pass its pre-flight checks (connect, authenticate, start the agent). (default: 10)"),
    remote_python: Optional[str] = typer.Option(None, metavar="PATH", help="The Python that runs the agent on remote hosts. (default: the path of poprun's own Python)"),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True, metavar="", show_default=False, help="More output; repeat for more (-vv). (default: warnings and errors only)"),
    vv: bool = typer.Option(False, "--vv", help="Very verbose output (as -vv)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> "CommandLine":  # noqa: UP037 - defined below, and Typer reads real types (no __future__ import)
    given = {
        name: value
        for name, value in ctx.params.items()
        if name not in APART and _given_on_command_line(ctx, name)
    }
    return CommandLine(given, tuple(program or ()), import_config, export_config, overwrite_config, dry_run)


def _given_on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def parse_command_line(argv: list[str]) -> CommandLine | int:
    """Parse ``argv`` (without the program name); an int is an exit code (``--help``, ``--version``)."""
    command = typer.main.get_command(app)
    swallowed: list[tuple[str, str]] = []
    argv = expand_bare_flags(argv, BOOLEANS, VALUED, swallowed, SHORT_FLAGS)  # (as Typer's definition says)
    line = command.main(args=argv, prog_name="poprun", standalone_mode=False)
    if isinstance(line, CommandLine) and swallowed:
        line = dataclasses.replace(line, swallowed=swallowed[-1])
    return line


def parse(args: list[str]) -> CommandLine | int:
    """The command line as Typer reads it, or an exit code: of ``--help``/``--version`` (their text written by
    now), or of a usage error Typer found (said in one line, as every error of poprun's)."""
    try:
        return _parse(args)
    except typer.Abort:
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:
        say(f"poprun: error: {one_line(exc.format_message())} (see 'poprun --help')")
        return EXIT_USAGE


def _parse(args: list[str]) -> CommandLine | int:
    """``parse``, less Typer's errors. The text of ``--help``/``--version`` goes through the parser's stream:
    flushed here, so that a failure to write it (a full disk, /dev/full) is one line and exit 80 rather than an
    internal error, or nothing at all.
    """
    try:
        with _help_width_within_bounds():
            line = parse_command_line(args)
        if not isinstance(line, CommandLine):
            sys.stdout.flush()
            return int(line or 0)
        return line
    except SystemExit as exc:  # how the parser ends when --help or --version meets a closed pipe
        if exc.code == 1 and stdout_lost_its_reader():
            return EXIT_BROKEN_PIPE
        raise
    except OSError as exc:
        if exc.errno in READER_GONE:
            return EXIT_BROKEN_PIPE
        raise own_output_lost(1, exc) from None


def option_table() -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """The command's options as ``quick_options.OPTIONS`` lists them: (name, flags, kind), in the order Typer
    has them, the help option last. Kinds: what the quick parse does with the option (``quick_options``)."""
    command = typer.main.get_command(app)
    rows = [(str(param.name), tuple(param.opts), _kind(param))
            for param in command.params if param.param_type_name == "option"]
    rows.append(("help", tuple(command.context_settings["help_option_names"]), "eager"))
    return tuple(rows)


def _kind(param: Any) -> str:
    if param.count:
        return "count"
    if param.is_flag:
        return "eager" if param.is_eager else "flag"
    if param.multiple:
        return "list"
    if param.metavar == _BOOL:
        return "yesno"
    return {"str": "str", "int": "int", "float": "float"}[param.type.name]  # (any other type: add it to both)


#: What rich (COLUMNS) and typer (TERMINAL_WIDTH) read, unchecked, as the width to draw --help at.
_HELP_WIDTHS = ("COLUMNS", "TERMINAL_WIDTH")
_MAX_HELP_WIDTH = 1000


@contextlib.contextmanager
def _help_width_within_bounds() -> Iterator[None]:
    """While the command line is read, a width that is not a number from 10 to 1000 is left out (the terminal's
    width, else 80, is used): TERMINAL_WIDTH=abc made --help an internal error, COLUMNS=10**11 a MemoryError,
    10**6 117 MB of spaces and 0 no help at all. The launch's environment is as it was, for the instances."""
    saved = {name: os.environ[name] for name in _HELP_WIDTHS if name in os.environ}
    for name, value in saved.items():
        if not (value.isdigit() and 10 <= int(value) <= _MAX_HELP_WIDTH):
            del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)
