"""The ``simipu`` command: the simulated IPU system's ``gc-info -l``, V-IPU server and ``vipu`` client.

Every V-IPU command talks to the embedded service over ``--state`` (default
``$XDG_STATE_HOME/poprun-py/vipu.sqlite``) unless ``--server HOST[:PORT]``
names a running ``simipu vipu-server``. Errors are one line on stderr and
an exit code per kind (see ``EXIT_CODES``); never a traceback.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from simipu.devices import DeviceBusy, DeviceError, default_device_dir, listing_lines
from simipu.durations import check_seconds
from simipu.private_files import UnsafePath
from simipu.vipu import (
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    ClusterMismatch,
    ClusterNotFound,
    InvalidPartitionRequest,
    NotEnoughIpus,
    Partition,
    PartitionExists,
    PartitionInUse,
    PartitionNotFound,
    PartitionRequest,
    PartitionTooLarge,
    VipuApi,
    VipuError,
    VipuProtocolError,
    VipuService,
    VipuStateError,
    VipuUnauthorized,
    VipuUnreachable,
    parse_server,
)
from simipu.vipu.api import default_token_path

log = logging.getLogger("simipu")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CANNOT_LISTEN = 14
EXIT_INTERNAL = 70
EXIT_CODES: dict[type[BaseException], int] = {
    VipuUnreachable: 3,
    PartitionNotFound: 4,
    ClusterNotFound: 5,
    PartitionExists: 6,
    PartitionTooLarge: 7,
    NotEnoughIpus: 8,
    InvalidPartitionRequest: 9,
    ClusterMismatch: 10,
    VipuStateError: 11,
    VipuProtocolError: 12,
    DeviceBusy: 13,
    DeviceError: 13,
    PartitionInUse: 15,
    VipuUnauthorized: 16,
    UnsafePath: 17,
}
"""Exit code per error type (the most specific class wins); other V-IPU errors exit 1, usage errors 2."""

_EPILOG = ("Exit codes: 0 ok, 1 other error, 2 usage, 3 server unreachable, 4 no such partition, "
           "5 no such cluster, 6 partition exists, 7 partition too large, 8 not enough free IPUs, "
           "9 invalid request, 10 cluster mismatch, 11 state file or its directory unusable or unsafe, "
           "12 server protocol error, 13 device busy, 14 cannot listen, 15 partition in use by another job, "
           "16 no or wrong token for the server, 17 unsafe token file, 70 internal error.")

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True, epilog=_EPILOG,
                  context_settings={"help_option_names": ["--help", "-h"]},
                  help="The simulated IPU system: devices (gc-info -l), the V-IPU server and its client.")
vipu_app = typer.Typer(no_args_is_help=True, epilog=_EPILOG,
                       help="Manage V-IPU partitions, like Graphcore's `vipu` command.")
app.add_typer(vipu_app, name="vipu")
_verbs = {}
for _verb, _help in (("create", "Create a partition."), ("list", "List partitions or clusters."),
                     ("show", "Show one partition."), ("remove", "Remove a partition, freeing its IPUs."),
                     ("reset", "Reset a partition to PS_ACTIVE."),
                     ("fail", "Put a partition into PS_FAILED, as a hardware error would (for tests).")):
    _verbs[_verb] = typer.Typer(no_args_is_help=True, help=_help, epilog=_EPILOG)
    vipu_app.add_typer(_verbs[_verb], name=_verb, hidden=_verb == "fail")  # fail: a fault to inject, not for users

ServerOption = Annotated[Optional[str], typer.Option(
    "--server", help="HOST[:PORT] of a V-IPU server (default port 8090). (default: the embedded service)",
    show_default=False)]


def _state_file(value: Optional[Path]) -> Optional[Path]:
    """An empty --state is the current directory to Path (and to SQLite, a file it cannot open): a usage error."""
    if value is not None and str(value) in ("", "."):
        raise typer.BadParameter("the path is empty; name the state file, or leave --state out for the default")
    return value


StateOption = Annotated[Optional[Path], typer.Option(
    "--state", help="State file of the embedded service. (default: $XDG_STATE_HOME/poprun-py/vipu.sqlite)",
    show_default=False, dir_okay=False, callback=_state_file)]
#: The least any of simipu's durations may be: a socket timeout of 0 would not wait at all.
MIN_SECONDS = 0.001


def _seconds(value: float) -> float:
    """A duration option, by the rule poprun's durations follow: nan, inf and 1e400 would switch a bound off."""
    try:
        return check_seconds(value, MIN_SECONDS)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the server.", callback=_seconds)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _exit_code(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_ERROR


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """Turn every error a user can cause into one line on stderr and its exit code."""
    try:
        yield
    except (VipuError, DeviceError, UnsafePath) as exc:
        typer.echo(f"simipu: error: {exc}", err=True)
        raise typer.Exit(_exit_code(exc)) from None


def _usage(message: str) -> typer.Exit:
    typer.echo(f"simipu: error: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


def _api(server: Optional[str], state: Optional[Path], timeout: float = DEFAULT_TIMEOUT) -> VipuApi:
    if server is None:
        return VipuService(state)
    if state is not None:
        raise _usage("--server and --state exclude each other: the server keeps its own state")
    try:
        host, port = parse_server(server, DEFAULT_PORT)
    except ValueError as exc:
        raise _usage(f"--server: {exc}") from None
    from simipu.vipu.client import VipuClient
    from simipu.vipu.token import read_token

    with _one_line_errors():
        token = read_token(default_token_path(), missing_ok=True)
    return VipuClient(host, port=port, timeout=timeout, token=token)


def _ranges(ipus: tuple[int, ...]) -> str:
    """``0-15,32-35``: a partition's IPUs, compactly."""
    spans: list[list[int]] = []
    for ipu in ipus:
        if spans and ipu == spans[-1][1] + 1:
            spans[-1][1] = ipu
        else:
            spans.append([ipu, ipu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "-"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _describe(partition: Partition) -> str:
    fields = [
        ("name", partition.name), ("cluster", partition.cluster), ("state", partition.state),
        ("size", str(partition.size)), ("ilds", f"{partition.num_ilds} ({', '.join(map(str, partition.ilds))})"),
        ("gcds", str(partition.num_gcds)), ("reconfigurable", "yes" if partition.reconfigurable else "no"),
        ("ipu-link routing", partition.ipu_link_routing_type), ("gw-link routing", partition.gw_link_routing_type),
        ("sync type", partition.sync_type), ("resets", str(partition.reset_count)),
        ("parent device id", str(partition.parent_device_id)), ("ipus", _ranges(partition.ipus)),
    ]
    fields += [(f"gcd {i}", _ranges(gcd)) for i, gcd in enumerate(partition.gcds)] if partition.num_gcds > 1 else []
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)} : {v}" for k, v in fields)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("poprun-py")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown"
        typer.echo(f"simipu (poprun-py) {number}")
        raise typer.Exit()


@app.callback()
def _main(verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, metavar="", show_default=False,
                                               help="Log what happens; -vv for more.")] = 0,
          _show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                      help="Show the version and exit.")] = False) -> None:
    if verbose:
        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(process)d %(name)s %(levelname).1s %(message)s")


@app.command()
def info(server: ServerOption = None, state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT,
         device_dir: Annotated[Optional[Path], typer.Option(
             help="Where attached processes hold their IPUs. (default: $XDG_STATE_HOME/poprun-py/devices)",
             show_default=False, file_okay=False)] = None) -> None:
    """List every partition's devices and who holds each IPU, as `gc-info -l` would."""
    with _one_line_errors():
        partitions = _api(server, state, timeout).list_partitions()
        typer.echo("\n".join(listing_lines(partitions, device_dir or default_device_dir())))


@app.command("vipu-server")
def vipu_server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one.", min=0, max=65535)] = DEFAULT_PORT,
    state: StateOption = None,
    cluster: Annotated[Optional[str], typer.Option(
        help="Size of the default cluster when the state has none: pod16, pod64, pod128, pod256 or a number of "
             "IPUs. (default: pod64)", show_default=False)] = None,
    token_file: Annotated[Optional[Path], typer.Option(
        help="The credential clients must send to change partitions; made (mode 0600) if missing. "
             "(default: $SIMIPU_VIPU_TOKEN_FILE, else $XDG_STATE_HOME/poprun-py/vipu-server.token)",
        show_default=False, dir_okay=False)] = None,
    io_timeout: Annotated[float, typer.Option(help="Seconds each read or write of a connection may wait.",
                                              callback=_seconds)] = 5.0,
    request_deadline: Annotated[float, typer.Option(help="Seconds one connection (a request and its reply) "
                                                         "may last.", callback=_seconds)] = 15.0,
    max_connections: Annotated[int, typer.Option(help="Connections open at once; at the cap the longest idle "
                                                      "one is dropped.", min=1)] = 64,
) -> None:
    """Serve the V-IPU HTTP API until SIGINT or SIGTERM; prints 'listening on HOST:PORT' once ready."""
    from simipu.fabric.join.addresses import host_port
    from simipu.vipu.server import ServerLimits, VipuServer
    from simipu.vipu.token import ensure_token

    if not logging.getLogger().handlers:  # the server's own warnings (refusals, binding beyond loopback)
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(asctime)s %(process)d %(name)s %(levelname).1s %(message)s")
    with _one_line_errors():
        service = VipuService(state, cluster=cluster)
        default = service.cluster()
        token = ensure_token(token_file or default_token_path())
    limits = ServerLimits(io_timeout=io_timeout, request_deadline=request_deadline, max_connections=max_connections)
    try:
        server = VipuServer(service, host=host, port=port, token=token, limits=limits)
    except OSError as exc:
        typer.echo(f"simipu: error: cannot listen on {host_port(host, port)}: {exc.strerror or exc}", err=True)
        raise typer.Exit(EXIT_CANNOT_LISTEN) from None
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # the server's threads inherit the mask
    try:
        server.start()
        typer.echo(f"simipu vipu-server: listening on {host_port(*server.address)} "
                   f"(cluster {default.name} of {default.size} IPUs, state {service.state_path})")
        sys.stdout.flush()
        received = signal.sigwait(stop_signals)
        log.info("V-IPU server: %s received, stopping", signal.Signals(received).name)
        server.shutdown()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    typer.echo("simipu vipu-server: stopped")


@_verbs["create"].command("partition")
def create_partition(
    name: Annotated[str, typer.Argument(help="The partition's name.", show_default=False)],
    size: Annotated[int, typer.Option(help="IPUs in the partition (a power of two).", show_default=False)],
    num_gcds: Annotated[int, typer.Option(help="Graph compile domains to split it into.")] = 1,
    num_ilds: Annotated[int, typer.Option(help="IPU-Link domains it spans.")] = 1,
    reconfigurable: Annotated[bool, typer.Option("--reconfigurable", help="Make it reconfigurable.")] = False,
    cluster: Annotated[Optional[str], typer.Option(help="Cluster to allocate from. (default: the service's)",
                                                   show_default=False)] = None,
    ipu_link_routing_type: Annotated[Optional[str], typer.Option(help="IPU-Link routing type. (default: ringswnc)",
                                                                 show_default=False)] = None,
    gw_link_routing_type: Annotated[Optional[str], typer.Option(help="GW-Link routing type. (default: ring)",
                                                                show_default=False)] = None,
    sync_type: Annotated[Optional[str], typer.Option(
        help="Sync type. (default: c2-compatible if reconfigurable, else pod-native-default)",
        show_default=False)] = None,
    server: ServerOption = None, state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Allocate IPUs for a new partition, atomically."""
    with _one_line_errors():
        request = PartitionRequest(name=name, size=size, cluster=cluster, num_ilds=num_ilds, num_gcds=num_gcds,
                                   reconfigurable=reconfigurable, ipu_link_routing_type=ipu_link_routing_type,
                                   gw_link_routing_type=gw_link_routing_type, sync_type=sync_type)
        partition = _api(server, state, timeout).create_partition(request)
        typer.echo(f"create partition ({partition.name}): success. IPUs {_ranges(partition.ipus)} "
                   f"of {partition.cluster}, parent device {partition.parent_device_id}.")


@_verbs["list"].command("partitions")
def list_partitions(server: ServerOption = None, state: StateOption = None,
                    timeout: TimeoutOption = DEFAULT_TIMEOUT, as_json: JsonOption = False) -> None:
    """List the partitions."""
    with _one_line_errors():
        partitions = _api(server, state, timeout).list_partitions()
    if as_json:
        typer.echo(json.dumps([p.to_json() for p in partitions]))
        return
    rows = [["NAME", "CLUSTER", "SIZE", "ILDS", "GCDS", "RECONFIGURABLE", "STATE", "IPUS"]]
    rows += [[p.name, p.cluster, str(p.size), str(p.num_ilds), str(p.num_gcds),
              "yes" if p.reconfigurable else "no", p.state, _ranges(p.ipus)] for p in partitions]
    typer.echo(_table(rows))


@_verbs["list"].command("clusters")
def list_clusters(server: ServerOption = None, state: StateOption = None,
                  timeout: TimeoutOption = DEFAULT_TIMEOUT, as_json: JsonOption = False) -> None:
    """List the clusters partitions are allocated from."""
    with _one_line_errors():
        clusters = _api(server, state, timeout).list_clusters()
    if as_json:
        typer.echo(json.dumps([c.to_json() for c in clusters]))
        return
    rows = [["NAME", "IPUS", "ILDS", "IPU-M2000S"]]
    rows += [[c.name, str(c.size), str(c.num_ilds), str(c.num_m2000s)] for c in clusters]
    typer.echo(_table(rows))


@_verbs["show"].command("partition")
def show_partition(name: Annotated[str, typer.Argument(show_default=False)], server: ServerOption = None,
                   state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT,
                   as_json: JsonOption = False) -> None:
    """Show one partition's settings, state and IPUs."""
    with _one_line_errors():
        partition = _api(server, state, timeout).get_partition(name)
    typer.echo(json.dumps(partition.to_json()) if as_json else _describe(partition))


@_verbs["remove"].command("partition")
def remove_partition(name: Annotated[str, typer.Argument(show_default=False)], server: ServerOption = None,
                     state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT) -> None:
    """Remove a partition, freeing its IPUs."""
    with _one_line_errors():
        _api(server, state, timeout).remove_partition(name)
    typer.echo(f"remove partition ({name}): success.")


@_verbs["reset"].command("partition")
def reset_partition(name: Annotated[str, typer.Argument(show_default=False)], server: ServerOption = None,
                    state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT) -> None:
    """Reset a partition: back to PS_ACTIVE."""
    with _one_line_errors():
        partition = _api(server, state, timeout).reset_partition(name)
    typer.echo(f"reset partition ({name}): success. State {partition.state}.")


@_verbs["fail"].command("partition")
def fail_partition(name: Annotated[str, typer.Argument(show_default=False)], server: ServerOption = None,
                   state: StateOption = None, timeout: TimeoutOption = DEFAULT_TIMEOUT) -> None:
    """Put a partition into PS_FAILED (to test how programs and poprun react)."""
    with _one_line_errors():
        partition = _api(server, state, timeout).mark_failed(name)
    typer.echo(f"fail partition ({name}): success. State {partition.state}.")


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point: usage errors and bugs are one line too, never a traceback."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=sys.argv[1:] if argv is None else argv, prog_name="simipu", standalone_mode=False)
    except typer.Abort:
        code = 130
    except typer.TyperException as exc:
        message = " ".join(exc.format_message().split())
        if message:  # empty when the help was shown for a bare group
            typer.echo(f"simipu: error: {message} (see 'simipu --help')", err=True)
        code = EXIT_USAGE
    except KeyboardInterrupt:
        typer.echo("simipu: interrupted", err=True)
        code = 130
    except Exception as exc:  # a bug: one line; the traceback with -v
        log.debug("internal error", exc_info=True)
        typer.echo(f"simipu: internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)", err=True)
        code = EXIT_INTERNAL
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
