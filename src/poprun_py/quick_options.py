"""A plain ``poprun`` command line read from a table of the options, without importing Typer.

``cli.py`` defines the options with Typer, and Typer parses every command
line whose meaning takes more than this module knows. Importing Typer (its
vendored click, ``inspect``, ``uuid``, ``platform``, shell completion) was
about a fifth of a launch of ``true``, for a parse a table does as well when
the command line is plain:

* every option is one of ``OPTIONS`` (its long name, ``-H``, or ``-v``s);
* every value is given, with ``=`` or as the next word (which must not start
  with ``-``), and an int or float is written in plain decimal digits;
* no ``--help``, ``-h`` or ``--version``.

Anything else returns None and Typer parses the whole command line, so every
usage error and its message are Typer's. What this module returns is what
Typer's parse returns (``cli.parse_command_line``): the same ``given``
options, in the same order, with the same values; ``OPTIONS`` is what
``cli.option_table()`` derives from the Typer definition.
``tests/test_quick_options.py`` holds both.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .argv import expand_bare_flags
from .command_line import APART, CommandLine

#: (name, flags, kind) of each option, as ``cli.option_table()`` gives them. Kinds: ``list`` (repeatable, a
#: tuple of words), ``str``, ``yesno`` (a word, checked later), ``int``, ``float``, ``count`` (``-v``, ``-vv``),
#: ``flag`` (true when given), ``eager`` (``--help``, ``--version``: for Typer).
OPTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("host", ("-H", "--host"), "list"),
    ("host_file", ("--host-file",), "str"),
    ("num_replicas", ("--num-replicas",), "int"),
    ("ipus_per_replica", ("--ipus-per-replica",), "int"),
    ("num_instances", ("--num-instances",), "int"),
    ("num_ilds", ("--num-ilds",), "int"),
    ("vipu_server_host", ("--vipu-server-host",), "str"),
    ("vipu_server_port", ("--vipu-server-port",), "int"),
    ("vipu_server_timeout", ("--vipu-server-timeout",), "int"),
    ("vipu_partition", ("--vipu-partition",), "str"),
    ("update_partition", ("--update-partition",), "yesno"),
    ("reset_partition", ("--reset-partition",), "yesno"),
    ("remove_partition", ("--remove-partition",), "yesno"),
    ("vipu_cluster", ("--vipu-cluster",), "str"),
    ("vipu_allocation", ("--vipu-allocation",), "str"),
    ("vipu_partition_attempts", ("--vipu-partition-attempts",), "int"),
    ("ipu_link_routing_type", ("--ipu-link-routing-type",), "str"),
    ("gw_link_routing_type", ("--gw-link-routing-type",), "str"),
    ("sync_type", ("--sync-type",), "str"),
    ("executable_cache_path", ("--executable-cache-path",), "str"),
    ("mpi_global_args", ("--mpi-global-args",), "list"),
    ("mpi_local_args", ("--mpi-local-args",), "list"),
    ("instance_mpi_local_args", ("--instance-mpi-local-args",), "list"),
    ("tag_output", ("--tag-output",), "yesno"),
    ("numa_aware", ("--numa-aware",), "yesno"),
    ("process_placement", ("--process-placement",), "str"),
    ("print_topology", ("--print-topology",), "yesno"),
    ("only_output_from_instance", ("--only-output-from-instance",), "int"),
    ("offline_mode", ("--offline-mode",), "yesno"),
    ("dry_run", ("--dry-run",), "yesno"),
    ("timeout", ("--timeout",), "float"),
    ("import_config", ("--import-config",), "str"),
    ("export_config", ("--export-config",), "str"),
    ("overwrite_config", ("--overwrite-config",), "yesno"),
    ("allow_run_as_root", ("--allow-run-as-root",), "yesno"),
    ("stop_grace", ("--stop-grace",), "float"),
    ("fabric_transport", ("--fabric-transport",), "str"),
    ("fabric_timeout", ("--fabric-timeout",), "float"),
    ("startup_timeout", ("--startup-timeout",), "float"),
    ("compat_imports", ("--compat-imports",), "yesno"),
    ("ssh_timeout", ("--ssh-timeout",), "float"),
    ("remote_python", ("--remote-python",), "str"),
    ("verbose", ("-v", "--verbose"), "count"),
    ("vv", ("--vv",), "flag"),
    ("version", ("--version",), "eager"),
    ("help", ("--help", "-h"), "eager"),
)

#: Each flag's (name, kind).
BY_FLAG: dict[str, tuple[str, str]] = {flag: (name, kind) for name, flags, kind in OPTIONS for flag in flags}
#: What ``argv.expand_bare_flags`` is told, as ``cli`` tells it from the Typer definition: the yes/no options,
#: the other options that take a value, and the short options that take none (with whether they count).
BOOLEANS = [flag for flag, (_, kind) in BY_FLAG.items() if kind == "yesno"]
VALUED = [flag for flag, (_, kind) in BY_FLAG.items() if kind in ("list", "str", "int", "float")]
SHORT_FLAGS = {flag: kind == "count" for flag, (_, kind) in BY_FLAG.items()
               if kind in ("count", "flag", "eager") and flag[1:2] != "-"}


def _decimal(value: str) -> bool:
    return value.isascii() and value.isdigit()


#: How a value of each kind is read; None: not plainly (Typer then reads the whole command line).
CONVERT: dict[str, Callable[[str], Any]] = {
    "list": str, "str": str, "yesno": str,
    "int": lambda value: int(value) if _decimal(value) else None,
    "float": lambda value: float(value) if all(map(_decimal, value.split(".", 1))) else None,
}


def quick_command_line(argv: Sequence[str]) -> CommandLine | None:
    """``argv`` (without the program name) read as Typer would read it, when it is plain (module docstring);
    None otherwise. Raises what ``expand_bare_flags`` raises, as Typer's parse does first."""
    swallowed: list[tuple[str, str]] = []
    args = expand_bare_flags(argv, BOOLEANS, VALUED, swallowed, SHORT_FLAGS)
    given: dict[str, Any] = {}
    at = 0
    while at < len(args):
        token = args[at]
        if token == "--":
            at += 1
            break
        if token == "-" or not token.startswith("-"):
            break
        taken = _option(token, args[at + 1] if at + 1 < len(args) else None, given)
        if not taken:
            return None
        at += taken
    apart = {name: given.pop(name) for name in APART if name in given}
    return CommandLine(given, tuple(args[at:]), apart.get("import_config"), apart.get("export_config"),
                       apart.get("overwrite_config"), apart.get("dry_run"), swallowed[-1] if swallowed else None)


def _option(token: str, following: str | None, given: dict[str, Any]) -> int:
    """Read the option ``token`` (and its value, ``following`` if not after ``=``) into ``given``: how many words
    it took; 0 if it is not plain."""
    flag, equals, value = token.partition("=")
    if flag not in BY_FLAG:
        return _short_cluster(token, given)
    name, kind = BY_FLAG[flag]
    if kind in ("count", "flag", "eager"):
        if equals or kind == "eager":
            return 0
        given[name] = given.get(name, 0) + 1 if kind == "count" else True
        return 1
    words = 1
    if not equals:
        if following is None or following.startswith("-"):
            return 0
        value, words = following, 2
    converted = CONVERT[kind](value)
    if converted is None:
        return 0
    given[name] = given.get(name, ()) + (converted,) if kind == "list" else converted  # (a tuple, as Typer's)
    return words


def _short_cluster(token: str, given: dict[str, Any]) -> int:
    """``-vv``: short options that take no value, together; 0 if ``token`` is anything else."""
    if token.startswith("--") or "=" in token:
        return 0
    kinds = [BY_FLAG.get(f"-{letter}", ("", ""))[1] for letter in token[1:]]
    if not kinds or any(kind not in ("count", "flag") for kind in kinds):
        return 0
    for letter in token[1:]:
        _option(f"-{letter}", None, given)
    return 1
