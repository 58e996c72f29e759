"""The ``poprun`` command: options -> ``LaunchSpec`` -> launch -> exit code.

Nothing else lives here: every error a user can cause becomes one line on
stderr and the exit code of its category (see ``errors.py``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, List, Optional

import typer

from . import __version__
from .console import quiet_closed_streams, stdout_lost_its_reader
from .errors import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, PoprunError, UsageError
from .logs import configure_logging
from .spec import LaunchSpec, build_spec, load_config, merge_options, parse_bool, save_config

log = logging.getLogger("poprun")

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]},
)

_V = "V-IPU"
_OUT = "Output"
_PLACE = "Placement"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"poprun (poprun-py) {__version__}")
        raise typer.Exit()


@app.command(help="Launch instances of PROGRAM (with its arguments) as Graphcore's PopRun does.")
def poprun(
    ctx: typer.Context,
    program: Optional[List[str]] = typer.Argument(None, help="The program and its arguments.", show_default=False),
    host: Optional[List[str]] = typer.Option(None, "-H", "--host", help="Comma-separated hosts on which to run instances; ranges like node[01-04] work."),
    host_file: Optional[str] = typer.Option(None, help="A file with one host per line (# comments allowed)."),
    num_replicas: Optional[int] = typer.Option(None, help="The total number of replicas. (default: 1)"),
    ipus_per_replica: Optional[int] = typer.Option(None, help="The number of IPUs per replica. (default: 1)"),
    num_instances: Optional[int] = typer.Option(None, help="The number of instances. (default: one per host)"),
    num_ilds: Optional[int] = typer.Option(None, help="The number of IPU-Link domains. (default: 1)"),
    vipu_server_host: Optional[str] = typer.Option(None, help="The host of the V-IPU server. (default: the embedded service)", rich_help_panel=_V),
    vipu_server_port: Optional[int] = typer.Option(None, help="The port of the V-IPU server. (default: 8090)", rich_help_panel=_V),
    vipu_server_timeout: Optional[int] = typer.Option(None, help="Timeout for V-IPU requests, seconds. (default: 10)", rich_help_panel=_V),
    vipu_partition: Optional[str] = typer.Option(None, help="Create/use this V-IPU partition.", rich_help_panel=_V),
    update_partition: Optional[str] = typer.Option(None, help="Update the partition if needed (yes/no). (default: no)", rich_help_panel=_V),
    reset_partition: Optional[str] = typer.Option(None, help="Reset the partition first (yes/no). (default: non-reconfigurable ones only)", rich_help_panel=_V),
    remove_partition: Optional[str] = typer.Option(None, help="Remove a partition poprun created, after the run (yes/no). (default: yes)", rich_help_panel=_V),
    vipu_cluster: Optional[str] = typer.Option(None, help="The V-IPU cluster to create partitions in.", rich_help_panel=_V),
    vipu_allocation: Optional[str] = typer.Option(None, help="The V-IPU allocation to create partitions in.", rich_help_panel=_V),
    vipu_partition_attempts: Optional[int] = typer.Option(None, help="Attempts at creating the partition. (default: 1)", rich_help_panel=_V),
    ipu_link_routing_type: Optional[str] = typer.Option(None, help="IPU-Link routing type of the partition.", rich_help_panel=_V),
    gw_link_routing_type: Optional[str] = typer.Option(None, help="GW-Link routing type of the partition.", rich_help_panel=_V),
    sync_type: Optional[str] = typer.Option(None, help="Sync type of the partition.", rich_help_panel=_V),
    executable_cache_path: Optional[str] = typer.Option(None, help="Directory for the executable cache (created if missing)."),
    mpi_global_args: Optional[List[str]] = typer.Option(None, help="mpirun options for all instances, e.g. '--tag-output'; repeatable.", rich_help_panel=_OUT),
    mpi_local_args: Optional[List[str]] = typer.Option(None, help="Per-instance mpirun options, e.g. '-x VAR=VALUE -x PATH'; repeatable.", rich_help_panel=_OUT),
    instance_mpi_local_args: Optional[List[str]] = typer.Option(None, help="<index>:<args> for one instance, e.g. '1:-x VAR=VALUE'; repeatable.", rich_help_panel=_OUT),
    numa_aware: Optional[str] = typer.Option(None, help="Bind instances to NUMA nodes round-robin (yes/no). (default: auto)", rich_help_panel=_PLACE),
    process_placement: Optional[str] = typer.Option(None, help="spreadnuma or disabled. (default: spreadnuma)", rich_help_panel=_PLACE),
    print_topology: Optional[str] = typer.Option(None, help="Print the topology table (yes/no). (default: no)", rich_help_panel=_OUT),
    only_output_from_instance: Optional[int] = typer.Option(None, help="Show only this instance's output (failures are always shown).", rich_help_panel=_OUT),
    offline_mode: Optional[str] = typer.Option(None, help="Run without requiring or attaching to any IPUs (yes/no). (default: no)"),
    import_config: Optional[str] = typer.Option(None, help="Read a launch saved with --export-config; command-line values win.", rich_help_panel="Config"),
    export_config: Optional[str] = typer.Option(None, help="Save this launch to a file (and run it if a program is given).", rich_help_panel="Config"),
    overwrite_config: Optional[str] = typer.Option(None, help="Let --export-config replace an existing file (yes/no).", rich_help_panel="Config"),
    allow_run_as_root: Optional[str] = typer.Option(None, help="Accepted for compatibility; poprun-py runs as any user."),
    stop_grace: Optional[float] = typer.Option(None, help="Seconds between SIGTERM and SIGKILL when stopping instances. (default: 5)"),
    fabric_transport: Optional[str] = typer.Option(None, help="auto (shared memory/Unix sockets within a host, TCP between) or tcp (TCP everywhere). (default: auto)", rich_help_panel="Fabric"),
    fabric_timeout: Optional[float] = typer.Option(None, help="Seconds after which a silent peer counts as lost in a collective. (default: 10)", rich_help_panel="Fabric"),
    startup_timeout: Optional[float] = typer.Option(None, help="Seconds the instances have to join the fabric once the first has. (default: 60)", rich_help_panel="Fabric"),
    ssh_timeout: Optional[float] = typer.Option(None, help="Seconds each remote host has to pass its pre-flight checks (connect, authenticate, start the agent). (default: 10)"),
    remote_python: Optional[str] = typer.Option(None, help="The Python that runs the agent on remote hosts. (default: the path of poprun's own Python)"),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True, help="Verbose output; -vv for more."),
    vv: bool = typer.Option(False, "--vv", help="Very verbose output."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> "CommandLine":
    given = {
        name: value
        for name, value in ctx.params.items()
        if name not in ("program", "import_config", "export_config", "overwrite_config", "version")
        and _given_on_command_line(ctx, name)
    }
    return CommandLine(given, tuple(program or ()), import_config, export_config, overwrite_config)


def _given_on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


@dataclass(frozen=True)
class CommandLine:
    """What the user typed: the options given (not defaulted) and the program."""

    given: dict[str, Any]
    program: tuple[str, ...]
    import_config: str | None = None
    export_config: str | None = None
    overwrite_config: str | None = None


def parse_command_line(argv: list[str]) -> CommandLine | int:
    """Parse ``argv`` (without the program name); an int is an exit code (``--help``, ``--version``)."""
    command = typer.main.get_command(app)
    return command.main(args=argv, prog_name="poprun", standalone_mode=False)


def resolve_launch(line: CommandLine) -> tuple[LaunchSpec | None, dict[str, Any], list[str]]:
    """Merge a config file under the command line and validate; save the launch if asked.

    Returns no spec when there is nothing to run (only ``--export-config``).
    """
    options, program = dict(line.given), list(line.program)
    if line.import_config:
        file_options, file_program = load_config(line.import_config)
        options = merge_options(file_options, line.given)
        program = program or file_program
    configure_logging(2 if options.get("vv") else int(options.get("verbose") or 0))
    spec = build_spec(options, program)
    if line.export_config:
        save_config(line.export_config, options, program, parse_bool("overwrite_config", line.overwrite_config or "no"))
        if not program:
            return None, options, program
    if not program:
        raise UsageError("no program given; usage: poprun [options] program [program args]")
    return spec, options, program


def _launch(line: CommandLine) -> int:
    from .launcher import run_launch  # imported late: --help and usage errors stay fast

    spec, _, _ = resolve_launch(line)
    return 0 if spec is None else run_launch(spec)


def main(argv: list[str] | None = None) -> int:
    """Entry point: never a traceback for a user's mistake, always a distinct exit code."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        quiet_closed_streams()


def _main(args: list[str]) -> int:
    try:
        try:
            line = parse_command_line(args)
        except SystemExit as exc:  # how the parser ends when --help or --version meets a closed pipe
            if exc.code == 1 and stdout_lost_its_reader():
                return EXIT_BROKEN_PIPE
            raise
        if not isinstance(line, CommandLine):
            return int(line or 0)
        return _launch(line)
    except typer.Abort:
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:
        sys.stderr.write(f"poprun: error: {_one_line(exc.format_message())} (see 'poprun --help')\n")
        return EXIT_USAGE
    except PoprunError as exc:
        sys.stderr.write(f"poprun: error: {_one_line(str(exc))}\n")
        sys.stderr.writelines(f"  {_one_line(line)}\n" for line in exc.details)
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("poprun: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # poprun's own output (the topology, say) lost its reader: as a pipeline expects
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug: one line, the traceback only with --vv
        log.debug("internal error", exc_info=True)
        sys.stderr.write(f"poprun: internal error: {type(exc).__name__}: {exc} (run with --vv for the traceback)\n")
        return EXIT_INTERNAL


def _one_line(text: str) -> str:
    return " ".join(text.split())
