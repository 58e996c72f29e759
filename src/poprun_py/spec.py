"""``LaunchSpec``: the whole launch as one frozen value, validated.

The CLI hands over only the options the user gave (a name -> raw value
mapping); defaults, ``--import-config`` merging and validation all happen
here, so a launch replayed from a config file is checked like one typed in.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from popdist.env import FABRIC_TRANSPORTS, FabricSettings

from .errors import UsageError
from .hosts import HostListError, HostSpec, parse_host_list, read_host_file, reject_duplicate_hosts
from .mpiargs import MpiArgs, parse_instance_args, parse_mpi_args, warn_ignored
from .records import InstanceSettings, OutputSettings, Placement, ReachSettings, Supervision, VipuSettings
from .validate import (
    InputFileTooLarge,
    check_config_types,
    check_launch,
    current_directory,
    option_flag,
    read_input_file,
    vipu_server_address,
)
from .validate import seconds as _seconds
from .validate import whole_number as _positive

log = logging.getLogger("poprun.spec")

CONFIG_FORMAT = "poprun-py-config/1"

#: The guide's defaults (Table 3.1) and those of later releases. ``None`` = not set.
DEFAULTS: dict[str, Any] = {
    "host": None,
    "host_file": None,
    "num_replicas": 1,
    "ipus_per_replica": 1,
    "num_instances": None,
    "num_ilds": 1,
    "vipu_server_host": None,
    "vipu_server_port": 8090,
    "vipu_server_timeout": 10,
    "vipu_partition": None,
    "vipu_cluster": None,
    "vipu_allocation": None,
    "vipu_partition_attempts": 1,
    "update_partition": "no",
    "reset_partition": None,
    "remove_partition": "yes",
    "ipu_link_routing_type": None,
    "gw_link_routing_type": None,
    "sync_type": None,
    "executable_cache_path": None,
    "mpi_global_args": [],
    "mpi_local_args": [],
    "instance_mpi_local_args": [],
    "numa_aware": None,
    "process_placement": "spreadnuma",
    "print_topology": "no",
    "tag_output": "no",
    "timeout": None,
    "only_output_from_instance": None,
    "offline_mode": "no",
    "allow_run_as_root": "no",
    "stop_grace": 5.0,
    "fabric_transport": "auto",
    "compat_imports": "yes",
    "fabric_timeout": 10.0,
    "startup_timeout": 60.0,
    "ssh_timeout": 10.0,
    "remote_python": None,
    "verbose": 0,
    "vv": False,
}

#: Options that add up when repeated on the command line and in a config file.
MERGED_LISTS = ("mpi_global_args", "mpi_local_args", "instance_mpi_local_args")

_TRUE = {"1", "yes", "true", "on", "y"}
_FALSE = {"0", "no", "false", "off", "n"}
#: Every word a yes/no option accepts as its value.
BOOLEAN_WORDS = frozenset(_TRUE | _FALSE)
PROCESS_PLACEMENTS = ("spreadnuma", "disabled")


def parse_bool(name: str, value: Any) -> bool:
    """yes/no, true/false, on/off, 1/0, as users of Graphcore's poprun wrote them."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UsageError(f"{option_flag(name)}: {value!r} is not a boolean; use yes/no, true/false or 1/0")


@dataclass(frozen=True)
class LaunchSpec:
    """One launch: what to run, and one record for each stage that reads the options (see ``records``)."""

    program: tuple[str, ...]
    placement: Placement
    vipu: VipuSettings
    offline_mode: bool
    instance: InstanceSettings
    output: OutputSettings
    fabric: FabricSettings  # without the token, chosen at launch
    supervision: Supervision
    reach: ReachSettings


def merge_options(file_options: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Config-file values under command-line ones; repeated list options add up."""
    merged = dict(file_options)
    for name, value in given.items():
        if name in MERGED_LISTS:
            merged[name] = list(file_options.get(name, [])) + list(value)
        else:
            merged[name] = value
    return merged


class _NumberTooLong(Exception):
    """A whole number in a config file longer than Python converts (``sys.get_int_max_str_digits``)."""

    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _config_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # (before, "... use sys.set_int_max_str_digits() to increase the limit")
        raise _NumberTooLong(len(text.lstrip("-"))) from None


def _read_config_json(path: str) -> Any:
    """The JSON of a saved launch; a file that is not JSON (empty as /dev/null, text, a number of 5000 digits) is
    said to be no poprun-py config, in words rather than the JSON parser's ("Expecting value")."""
    try:
        raw = read_input_file(path)
    except FileNotFoundError:
        raise UsageError(f"--import-config: no such file {path!r}") from None
    except InputFileTooLarge as exc:
        raise UsageError(f"--import-config: {path!r} is larger than {exc.limit}, the most poprun reads; name a "
                         "file saved with --export-config") from None
    except OSError as exc:
        raise UsageError(f"--import-config: cannot read {path!r}: {exc.strerror or exc}") from None
    hint = "name a file saved with --export-config"
    not_config = f"--import-config: {path!r} is not a poprun-py config"
    if not raw.strip():
        raise UsageError(f"{not_config}: the file is empty, not JSON; {hint}")
    try:
        return json.loads(raw, parse_int=_config_int)
    except RecursionError:  # JSON nested thousands deep: no saved launch looks like that
        raise UsageError(f"--import-config: cannot read {path!r}: its JSON is nested too deeply; {hint}") from None
    except _NumberTooLong as exc:
        raise UsageError(f"{not_config}: it holds a number of {exc.digits} digits; {hint}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{not_config}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {hint}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{not_config}: not text (UTF-8), so not JSON; {hint}") from None
    except ValueError as exc:
        raise UsageError(f"{not_config}: {exc}; {hint}") from None


def load_config(path: str) -> tuple[dict[str, Any], list[str]]:
    """Read a saved launch: (options, program)."""
    data = _read_config_json(path)
    if not isinstance(data, dict) or data.get("format") != CONFIG_FORMAT:
        raise UsageError(f"--import-config: {path!r} is not a poprun-py config (expected format {CONFIG_FORMAT})")
    options = data.get("options", {})
    check_config_types(path, options, data.get("program", []), DEFAULTS)
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise UsageError(f"--import-config: {path!r} has unknown options: {', '.join(map(option_flag, unknown))}")
    return dict(options), list(data.get("program", []))


def save_config(path: str, options: Mapping[str, Any], program: list[str], overwrite: bool) -> None:
    from pathlib import Path  # (only here: a launch does without pathlib's import)

    target = Path(path)
    body = {"format": CONFIG_FORMAT, "options": dict(options), "program": program}
    try:  # (the checks too: a name too long for the file system is an OSError of the first stat)
        if target.is_dir():
            raise UsageError(f"--export-config: {path!r} is a directory; name a file, e.g. "
                             f"{os.path.join(path, 'launch.json')}")
        if target.exists() and not overwrite:
            raise UsageError(f"--export-config: {path!r} exists; add --overwrite-config=yes to replace it")
        target.write_text(json.dumps(body, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"--export-config: cannot write {path!r}: {exc.strerror}") from None
    log.info("Saved the launch to %s", path)


def _hosts(options: Mapping[str, Any]) -> tuple[HostSpec, ...]:
    try:
        hosts: tuple[HostSpec, ...] = ()
        for text in options.get("host") or []:
            hosts += parse_host_list(text)
        if options.get("host_file"):
            hosts += read_host_file(options["host_file"])
        reject_duplicate_hosts(hosts, "--host/--host-file")
    except HostListError as exc:
        raise UsageError(str(exc)) from None
    return hosts


def _optional_str(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    if not str(value).strip():
        raise UsageError(f"{option_flag(name)}: the value is empty")
    return str(value)


def _absolute(path: str | None, flag: str) -> str | None:
    """A path made absolute against poprun's directory, where it was typed: instances that change directory,
    start in another (``-wdir``) or run on another host must reach the same place."""
    if path is None:
        return None
    if not os.path.isabs(path):
        path = os.path.join(current_directory(f"{flag} {path!r} is relative to it"), path)
    return os.path.normpath(path)


def build_spec(options: Mapping[str, Any], program: list[str]) -> LaunchSpec:
    """Validate the effective options (defaults filled in here) into a ``LaunchSpec``.

    Each value is checked alone (``validate``'s bounds) and then with the others
    (``check_launch``), here only, so nothing later meets a value it cannot take.
    """
    spec = _spec_from(options, program)
    check_launch(spec, os.environ)
    return spec


def _spec_from(options: Mapping[str, Any], program: list[str]) -> LaunchSpec:
    o = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    placement = _placement(o)
    global_args, local_args, instance_args = _mpi_settings(o, placement.num_instances)
    binding = global_args.merged(local_args)
    if binding.bind_to is not None:  # (mpirun's --bind-to: ``Placement.numa_wanted``)
        placement = replace(placement, bind_to=binding.bind_to, bind_overload=binding.overload)
    vipu = _vipu_settings(o, port_given=options.get("vipu_server_port") is not None)
    parse_bool("allow_run_as_root", o["allow_run_as_root"])  # accepted; poprun-py never needs root
    return LaunchSpec(
        program=tuple(program),
        placement=placement,
        vipu=vipu,
        offline_mode=parse_bool("offline_mode", o["offline_mode"]),
        instance=InstanceSettings(
            env=global_args.env + local_args.env,
            instance_env={index: args.env for index, args in instance_args.items()},
            executable_cache_path=_absolute(_optional_str(o, "executable_cache_path"), "--executable-cache-path"),
            compat_imports=parse_bool("compat_imports", o["compat_imports"]),
        ),
        output=_output_settings(o, global_args, local_args, placement.num_instances),
        fabric=FabricSettings(
            transport=_one_of("fabric_transport", o["fabric_transport"], FABRIC_TRANSPORTS),
            timeout=_seconds("fabric_timeout", o["fabric_timeout"]),
            startup_timeout=_seconds("startup_timeout", o["startup_timeout"]),
        ),
        supervision=Supervision(
            stop_grace=_seconds("stop_grace", o["stop_grace"], allow_zero=True),
            timeout=None if o["timeout"] is None else _seconds("timeout", o["timeout"]),
        ),
        reach=ReachSettings(
            ssh_timeout=_seconds("ssh_timeout", o["ssh_timeout"]),
            remote_python=_optional_str(o, "remote_python"),
            working_dir=global_args.merged(local_args).working_dir,
        ),
    )


def _placement(o: Mapping[str, Any]) -> Placement:
    """How many of each, on which hosts: each count checked, then that they divide evenly."""
    hosts = _hosts(o)
    num_replicas = _positive("num_replicas", o["num_replicas"])
    ipus_per_replica = _positive("ipus_per_replica", o["ipus_per_replica"])
    num_instances = _positive("num_instances", o["num_instances"] if o["num_instances"] is not None else max(1, len(hosts)))
    num_ilds = _positive("num_ilds", o["num_ilds"])
    if num_replicas % num_instances:
        raise UsageError(
            f"--num-replicas {num_replicas} cannot be divided evenly among --num-instances {num_instances}; "
            "use a number of replicas that is a multiple of the number of instances"
        )
    if hosts and num_instances % len(hosts):
        raise UsageError(
            f"--num-instances {num_instances} cannot be divided evenly among {len(hosts)} hosts; "
            f"use a multiple of {len(hosts)}"
        )
    numa_aware = None if o["numa_aware"] is None else parse_bool("numa_aware", o["numa_aware"])
    return Placement(num_instances, num_replicas, ipus_per_replica, num_ilds, hosts, numa_aware,
                     _one_of("process_placement", o["process_placement"], PROCESS_PLACEMENTS))


def _output_settings(o: Mapping[str, Any], global_args: MpiArgs, local_args: MpiArgs,
                     num_instances: int) -> OutputSettings:
    if "" in (global_args.output_filename, local_args.output_filename):
        raise UsageError("--output-filename: the directory is empty; name the directory for the output files")
    only = o["only_output_from_instance"]
    if only is not None:
        only = _positive("only_output_from_instance", only, minimum=0)
        if only >= num_instances:
            raise UsageError(
                f"--only-output-from-instance {only}: there are {num_instances} instances (0 to {num_instances - 1})"
            )
    return OutputSettings(
        tag_output=parse_bool("tag_output", o["tag_output"]) or global_args.tag_output or local_args.tag_output,
        timestamp_output=global_args.timestamp_output or local_args.timestamp_output,
        output_filename=local_args.output_filename or global_args.output_filename,
        output_nocopy=global_args.merged(local_args).output_nocopy,
        merge_stderr=global_args.merge_stderr or local_args.merge_stderr,
        only_instance=only,
        print_topology=parse_bool("print_topology", o["print_topology"]),
        verbosity=2 if o["vv"] else min(int(o["verbose"]), 2),
    )


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """A word option's value, lower-cased, if it is one of ``allowed``."""
    word = str(value).lower()
    if word not in allowed:
        raise UsageError(f"{option_flag(name)}: {value!r} is not one of {', '.join(allowed)}")
    return word


def _mpi_settings(o: Mapping[str, Any], num_instances: int) -> tuple[MpiArgs, MpiArgs, dict[int, MpiArgs]]:
    """The mpirun-style options (global, local, per instance), parsed; what poprun-py ignores is said once."""
    global_args = parse_mpi_args(o["mpi_global_args"], "--mpi-global-args")
    local_args = parse_mpi_args(o["mpi_local_args"], "--mpi-local-args")
    instance_args = parse_instance_args(o["instance_mpi_local_args"], num_instances)
    warn_ignored(global_args, "--mpi-global-args")
    warn_ignored(local_args, "--mpi-local-args")
    for index, args in instance_args.items():
        warn_ignored(args, f"--instance-mpi-local-args={index}")
        if args.tag_output or args.timestamp_output or args.output_filename or args.merge_stderr:
            log.warning("--instance-mpi-local-args=%d: only -x applies per instance; "
                        "output options go in --mpi-global-args", index)
        if args.bind_to is not None:
            log.warning("--instance-mpi-local-args=%d: ignoring --bind-to: it applies to every instance; put it "
                        "in --mpi-local-args", index)
    return global_args, local_args, instance_args


def _vipu_settings(o: Mapping[str, Any], port_given: bool = False) -> VipuSettings:
    """The V-IPU options, checked."""
    host, port = vipu_server_address(_optional_str(o, "vipu_server_host"),
                                     _positive("vipu_server_port", o["vipu_server_port"]), port_given)
    vipu = VipuSettings(
        server_host=host,
        server_port=port,
        server_timeout=_positive("vipu_server_timeout", o["vipu_server_timeout"]),
        partition=_optional_str(o, "vipu_partition"),
        cluster=_optional_str(o, "vipu_cluster"),
        allocation=_optional_str(o, "vipu_allocation"),
        partition_attempts=_positive("vipu_partition_attempts", o["vipu_partition_attempts"]),
        update_partition=parse_bool("update_partition", o["update_partition"]),
        reset_partition=None if o["reset_partition"] is None else parse_bool("reset_partition", o["reset_partition"]),
        remove_partition=parse_bool("remove_partition", o["remove_partition"]),
        ipu_link_routing_type=_optional_str(o, "ipu_link_routing_type"),
        gw_link_routing_type=_optional_str(o, "gw_link_routing_type"),
        sync_type=_optional_str(o, "sync_type"),
    )
    if vipu.server_port > 65535:
        raise UsageError(f"--vipu-server-port: {vipu.server_port} is not a TCP port (1-65535)")
    return vipu
