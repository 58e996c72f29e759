"""Bounds for every value a user gives, checked once, where the command line is read.

``build_spec`` calls these for the options typed and for those replayed from
``--import-config`` alike, so a value that passes here cannot overflow, crash
an instance or make a healthy job fail later: each mistake is one line, exit 2,
saying what to change.

The bounds, and why:

* Seconds are finite and at most ``MAX_SECONDS`` (about 11.5 days). The
  instances wait with ``poll``/``epoll``, which take milliseconds in a C
  ``int`` (at most 2**31 ms, about 24.8 days); a larger value crashed every
  instance in ``popdist.init()``, ``inf`` crashed poprun.
* ``--fabric-timeout`` is at least ``MIN_FABRIC_TIMEOUT`` (1 s). Members of
  the fabric beat four times per timeout (at most every
  1 s), so any timeout has heartbeats to spare; below a
  second, the scheduling delays of a loaded host alone would declare healthy
  instances lost, and the heartbeats would cost CPU the program needs.
* Counts are at most ``MAX_COUNT`` (2**20), the number of IPUs too, so no
  product of them overflows a C long and no loop runs for ever.
* Host names follow DNS (RFC 1035): at most 253 characters, 63 per label.
* Files named by ``--import-config`` and ``--host-file`` are read up to
  ``MAX_INPUT_FILE`` (4 MiB): twice the program arguments the kernel takes by
  default (``ARG_MAX``, 2 MiB), so any launch that can run can be replayed,
  and room for ``MAX_HOSTS`` host names; a wrong file named by mistake (a
  checkpoint, ``/dev/zero``) is refused at once instead of filling memory.
* The program's arguments and environment fit the kernel's limits for
  ``execve`` (``getconf ARG_MAX`` in all, ``MAX_ARG_STRLEN`` per string), so
  the instances can be started at all.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from popdist.env import MASTER_ADDR, MASTER_PORT
from simipu.durations import MAX_SECONDS, check_seconds
from simipu.durations import shown as _short  # values in errors, cut as the seconds' are

from .errors import UsageError

log = logging.getLogger("poprun.validate")

if TYPE_CHECKING:
    from .hosts import HostSpec
    from .records import InstanceSettings, Placement, VipuSettings
    from .spec import LaunchSpec

MAX_COUNT = 2**20
MIN_FABRIC_TIMEOUT = 1.0
#: Per-option bounds where they differ from the rule for their kind (seconds or counts).
MINIMUM_SECONDS: dict[str, float] = {"fabric_timeout": MIN_FABRIC_TIMEOUT}
MAXIMUM_NUMBER: dict[str, int] = {"vipu_server_port": 65535, "vipu_server_timeout": int(MAX_SECONDS)}
_WHAT = {"vipu_server_port": " (a TCP port)", "vipu_server_timeout": " second"}
#: What a job-wide ``-x`` may choose of poprun's contract (torchrun's ``--master-addr``, ``--master-port``).
MASTER_CHOICES = frozenset({MASTER_ADDR, MASTER_PORT})
#: Linux's limit on one argument or environment string (32 pages, the terminating NUL included).
MAX_ARG_STRLEN = 32 * os.sysconf("SC_PAGE_SIZE")
#: Room kept for what poprun adds to each instance's environment (the POPDIST_*, IPUOF_*, ... contract).
CONTRACT_ALLOWANCE = 16 * 1024
MAX_HOST_NAME = 253
MAX_HOST_LABEL = 63
MAX_INPUT_FILE = 4 << 20

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def whole_number(name: str, value: Any, minimum: int = 1) -> int:
    """A count or port as typed (or read from a config file), within its bounds."""
    maximum = MAXIMUM_NUMBER.get(name, MAX_COUNT)
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and _INTEGER.fullmatch(value))):
        raise UsageError(f"{option_flag(name)}: {value!r} is not a whole number")
    number = int(value)
    if number < minimum:
        raise UsageError(f"{option_flag(name)}: must be at least {minimum}{_unit(name, minimum)}, got {number}")
    if number > maximum:
        raise UsageError(f"{option_flag(name)}: must be at most {maximum}{_unit(name, maximum)}, got {_short(number)}")
    return number


def _unit(name: str, bound: int) -> str:
    """What a bound counts, if the option says: ' (a TCP port)', ' second' for 1, ' seconds' otherwise."""
    what = _WHAT.get(name, "")
    return what + "s" if what == " second" and bound != 1 else what


def seconds(name: str, value: Any, allow_zero: bool = False) -> float:
    """A duration as typed: the one rule for seconds (``simipu.durations``), the flag named in the error."""
    why = " (a peer is declared lost after missing four heartbeats in that time)" if name == "fabric_timeout" else ""
    try:
        return check_seconds(value, MINIMUM_SECONDS.get(name, 0.0), allow_zero, why)
    except ValueError as exc:
        raise UsageError(f"{option_flag(name)}: {exc}") from None


def current_directory(needed_for: str = "the instances would start in it") -> str:
    """poprun's own directory; one deleted since the shell entered it is a usage error, not a FileNotFoundError
    (an internal error) from ``os.getcwd``."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError(f"the current directory no longer exists (deleted?), and {needed_for}; "
                         "cd to a directory that exists, or give absolute paths (-wdir DIR in --mpi-global-args "
                         "for the instances' directory)") from None


class InputFileTooLarge(ValueError):
    """A file the user named holds more than ``MAX_INPUT_FILE`` bytes; the caller says which option named it."""

    limit = f"{MAX_INPUT_FILE >> 20} MiB"


def read_input_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a small file the user named, at most ``MAX_INPUT_FILE`` of them (see the module docstring).

    Any readable file will do, a pipe too (``--host-file <(make_hosts)``): only
    what is read is bounded. Raises ``OSError``, or ``InputFileTooLarge``.
    """
    with open(path, "rb") as file:
        data = file.read(MAX_INPUT_FILE + 1)
    if len(data) > MAX_INPUT_FILE:
        raise InputFileTooLarge(os.fspath(path))
    return data


def vipu_server_address(host: str | None, port: int, port_given: bool) -> tuple[str | None, int]:
    """``--vipu-server-host`` as simipu's ``--server`` takes it: a name, an IPv4 or IPv6 address (bare or in
    brackets), with or without ``:PORT``; a port there and a different ``--vipu-server-port`` contradict."""
    if host is None:
        return None, port
    from simipu.vipu.api import parse_server

    try:
        name, own_port = parse_server(host, default_port=0)  # 0: no port in the value
    except ValueError as exc:
        raise UsageError(f"--vipu-server-host: {exc}") from None
    if name.startswith("-"):  # no DNS label does; most likely the next option taken for the value (as -H says)
        raise UsageError(f"--vipu-server-host: bad host name {_short(name)!r}: a host name cannot start with '-'; is "
                         "the host missing after --vipu-server-host?")
    if not is_dns_name_or_address(name):
        raise UsageError(f"--vipu-server-host: {_not_a_dns_name(name)}")
    if own_port and port_given and own_port != port:
        raise UsageError(f"--vipu-server-host {_short(host)} names port {own_port} but --vipu-server-port is {port}; "
                         "give the port once")
    return name, own_port or port


# -- --import-config: the JSON types of a saved launch -----------------------------------------------
_LISTS = ("host", "mpi_global_args", "mpi_local_args", "instance_mpi_local_args")
_YES_NO_DEFAULT_NONE = ("reset_partition", "numa_aware")  # yes/no options whose default is "not set"
_COUNTS_DEFAULT_NONE = ("num_instances", "only_output_from_instance")
_SECONDS_DEFAULT_NONE = ("timeout",)  # --timeout: no time limit unless given


def _json_kind(name: str, default: Any) -> tuple[tuple[type, ...], str]:
    """The JSON types an option may have in a config file (from its default's type), and how to say so."""
    if name in _LISTS or isinstance(default, list):
        return (list,), "a list of strings"
    if isinstance(default, bool):
        return (bool,), "true or false"
    if name in _YES_NO_DEFAULT_NONE or (isinstance(default, str) and default.lower() in ("yes", "no")):
        return (bool, str), "true/false or a yes/no string"
    if isinstance(default, float) or name in _SECONDS_DEFAULT_NONE:
        return (int, float), "a number"
    if isinstance(default, int) or name in _COUNTS_DEFAULT_NONE:
        return (int,), "a whole number"
    return (str,), "a string"


def check_config_types(path: str, options: Any, program: Any, defaults: Mapping[str, Any]) -> None:
    """Refuse a saved launch whose values have the wrong JSON types (a string is not a list)."""
    where = f"--import-config: {path!r}"
    if not isinstance(options, dict):
        raise UsageError(f"{where}: \"options\" must be an object (name: value), not {type(options).__name__}")
    if not isinstance(program, list) or not all(isinstance(word, str) for word in program):
        raise UsageError(f"{where}: \"program\" must be a list of strings, e.g. [\"python3\", \"train.py\"]")
    for name, value in options.items():
        if value is None or name not in defaults:
            continue  # null means the default; unknown names are refused by the caller
        kinds, wanted = _json_kind(name, defaults[name])
        bad = isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds)
        if not bad and isinstance(value, list):
            bad = not all(isinstance(item, str) for item in value)
        if bad:
            raise UsageError(f"{where}: option {name!r} must be {wanted}, not {_short(json.dumps(value))}")
    _refuse_unencodable(where, options, program)


def _refuse_unencodable(where: str, options: Mapping[str, Any], program: list[str]) -> None:
    """A string no argument, path or variable can hold, which no command line can give but a file can: a NUL
    (JSON's \\u0000), or a character the system's encoding cannot encode (a lone surrogate such as \\ud800;
    not those Python makes of undecodable bytes, which round-trip). Said here, not as an internal error from
    the first system call that meets it."""
    for label, value in (('"program"', program), *((f"option {name!r}", v) for name, v in options.items())):
        for word in value if isinstance(value, list) else [value]:
            problem = _unencodable(word) if isinstance(word, str) else None
            if problem:
                raise UsageError(f"{where}: {label} contains {problem}, which no argument, path or environment "
                                 "variable can hold")


def _unencodable(word: str) -> str | None:
    if "\0" in word:
        return "a NUL character (\\u0000)"
    try:
        os.fsencode(word)
    except UnicodeEncodeError as exc:
        return f"{word[exc.start]!r}, a character {exc.encoding} cannot encode"
    return None


# -- the launch as a whole -----------------------------------------------------------------------------
def check_host_names(hosts: Iterable[HostSpec]) -> None:
    """DNS's limits, checked before any name reaches a resolver (which fails with an internal error)."""
    for host in hosts:
        if not is_dns_name_or_address(host.name):
            raise UsageError(f"{_not_a_dns_name(host.name)}; check the --host/--host-file value")


def is_dns_name_or_address(name: str) -> bool:
    """An IP address, or a name within DNS's limits that the resolver's IDNA codec takes (it raises UnicodeError,
    an internal error, for an empty label or one over 63 characters, ``a..b``)."""
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
        return True
    except ValueError:
        pass
    labels = name.rstrip(".").split(".")
    if len(name) > MAX_HOST_NAME or any(not label or len(label) > MAX_HOST_LABEL for label in labels):
        return False
    if name.isascii():  # (the codec's checks of an ASCII name are the ones above; its import is ~2 ms)
        return True
    try:
        name.encode("idna")
    except UnicodeError:  # (a Unicode label longer than 63 once encoded)
        return False
    return True


def _not_a_dns_name(name: str) -> str:
    return (f"host name {_short(name)!r} is not a valid DNS name: at most {MAX_HOST_NAME} characters, "
            f"dot-separated labels of 1 to {MAX_HOST_LABEL}")


def warn_hosts_over_their_slots(placement: Placement) -> None:
    """A host file's ``slots=N`` is a host's capacity to mpirun; poprun places instances evenly whatever the
    slots (as Graphcore's), so a host given more than its slots is said, not silently oversubscribed."""
    if not placement.hosts or placement.num_instances % len(placement.hosts):
        return  # (an uneven split is refused with its own message)
    per_host = placement.instances_per_host
    for host in placement.hosts:
        if host.slots is not None and per_host > host.slots:
            log.warning("host %s runs %d instances, more than its slots=%d: poprun places instances evenly among "
                        "the hosts, whatever their slots", host, per_host, host.slots)


def check_exec_size(program: Iterable[str], extra_env: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """The instances' argv and environment must fit ``execve``'s limits, or no instance can start."""
    strings = 0
    count = 0
    for index, word in enumerate(program):
        size = len(os.fsencode(word)) + 1
        if size > MAX_ARG_STRLEN:
            raise UsageError(
                f"argument {index} of the program is {size - 1} bytes long; Linux takes at most "
                f"{MAX_ARG_STRLEN - 1} per argument: pass large data in a file instead"
            )
        strings += size
        count += 1
    for name, value in {**environ, **extra_env}.items():
        size = len(os.fsencode(name)) + len(os.fsencode(value)) + 2
        if size > MAX_ARG_STRLEN:
            raise UsageError(
                f"environment variable {name} is {size - 2} bytes long; Linux takes at most "
                f"{MAX_ARG_STRLEN - 2} per variable: pass large data in a file instead"
            )
        strings += size
        count += 1
    limit = os.sysconf("SC_ARG_MAX")
    total = strings + 8 * (count + 2) + CONTRACT_ALLOWANCE
    if total > limit:
        raise UsageError(
            f"the program's arguments and environment take about {total} bytes, more than the kernel's limit "
            f"of {limit} (getconf ARG_MAX): pass large data in a file instead, or raise the limit (ulimit -s)"
        )


def check_cache_dir(path: str | None) -> None:
    """``--executable-cache-path`` must be a directory, or one that can be made; checked without making it,
    so ``--dry-run`` refuses what the launch would (the launch makes it, ``planning.prepare_cache``)."""
    if path is None:
        return
    flag = "--executable-cache-path"
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag}: {path!r} is not a directory; name a directory (it is made if missing)")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{flag}: cannot create {path!r}: {existing!r} is not a directory")
    if existing != path and _name_too_long(path, existing):
        raise UsageError(f"{flag}: cannot create {path!r}: {os.strerror(errno.ENAMETOOLONG)}")


def _name_too_long(path: str, existing: str) -> bool:
    """Whether making ``path`` under its deepest ``existing`` directory would fail with ENAMETOOLONG: a name
    in it longer than that file system's NAME_MAX, or the whole longer than PATH_MAX (in bytes, as the kernel
    counts). The launch's ``mkdir`` says so; before, ``--dry-run`` accepted such a path."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # a file system that does not say: the launch will
        return False
    missing = os.path.relpath(path, existing).split(os.sep)
    return len(os.fsencode(path)) >= path_max or any(len(os.fsencode(name)) > name_max for name in missing)


def check_vipu_names(vipu: VipuSettings) -> None:
    """Partition and cluster names by the V-IPU service's own rule (they go into URLs and file names), and the
    routing and sync types it takes, so a malformed one is a usage error here, with or without --dry-run, not a
    refusal at launch."""
    named = {"vipu_partition": vipu.partition, "vipu_cluster": vipu.cluster, "vipu_allocation": vipu.allocation,
             "ipu_link_routing_type": vipu.ipu_link_routing_type, "gw_link_routing_type": vipu.gw_link_routing_type,
             "sync_type": vipu.sync_type}
    if not any(named.values()):
        return
    from simipu.vipu.models import LINK_SETTINGS, check_cluster_name, check_link_setting, check_partition_name

    for option, name in named.items():
        try:
            if name is None:
                continue
            if option in LINK_SETTINGS:
                check_link_setting(option, name)
            else:
                (check_partition_name if option == "vipu_partition" else check_cluster_name)(name)
        except ValueError as exc:
            raise UsageError(f"{option_flag(option)}: {exc}") from None


def check_vipu_place(vipu: VipuSettings) -> None:
    """``--vipu-cluster`` (the guide's) and ``--vipu-allocation`` (later releases' name) both say where partitions
    are created: two different places contradict (before, the cluster was used and the allocation ignored)."""
    if vipu.cluster is not None and vipu.allocation is not None and vipu.cluster != vipu.allocation:
        raise UsageError(f"--vipu-cluster {_short(vipu.cluster)} and --vipu-allocation {_short(vipu.allocation)} "
                         "both name where partitions are created; give one of them")


def as_flag(name: str, value: object) -> str:
    """An option and its value as typed on poprun's command line: ``--num-replicas 8``."""
    return f"{option_flag(name)} {value}"


def too_many_ipus(placement: Placement, said: Callable[[str, object], str] = as_flag) -> str | None:
    """Why the launch asks for more IPUs than ``MAX_COUNT``, or None. ``said`` names an option with its value
    as the user gave it: a flag for poprun, a keyword (``num_replicas=8``) for ``launch()`` and the marker."""
    if placement.num_ipus <= MAX_COUNT:
        return None
    return (f"{said('num_replicas', placement.num_replicas)} x {said('ipus_per_replica', placement.ipus_per_replica)}"
            f" is {_short(placement.num_ipus)} IPUs; at most {MAX_COUNT} can be asked for")


def check_launch(spec: LaunchSpec, environ: Mapping[str, str]) -> None:
    """Checks across options, once every single value is known to be in bounds."""
    placement = spec.placement
    problem = too_many_ipus(placement)
    if problem:
        raise UsageError(problem)
    if placement.num_ipus % placement.num_ilds:
        raise UsageError(
            f"--num-ilds {placement.num_ilds} does not divide the {placement.num_ipus} IPUs of the launch "
            "(--num-replicas x --ipus-per-replica); use a number of IPU-Link domains that divides it"
        )
    check_host_names(placement.hosts)
    check_cache_dir(spec.instance.executable_cache_path)
    check_vipu_names(spec.vipu)
    check_vipu_place(spec.vipu)
    warn_hosts_over_their_slots(placement)
    extra = {setting.name: setting.value for setting in spec.instance.all_settings() if setting.value is not None}
    check_exec_size(spec.program, extra, environ)
    check_master_choice(spec.instance, environ)


def check_master_choice(instance: InstanceSettings, environ: Mapping[str, str]) -> None:
    """``-x MASTER_ADDR=...`` / ``-x MASTER_PORT=N`` choose them (torchrun's ``--master-addr/--master-port``):
    for every instance alike, a port in 1..65535 and an address without spaces. A bad one would surface only
    as torch's connection error in every instance, long after the launch."""
    for index, settings in sorted(instance.instance_env.items()):
        for setting in settings:
            if setting.name in MASTER_CHOICES:
                raise UsageError(f"--instance-mpi-local-args={index}: -x {setting.name} must be the same for every "
                                 f"instance; set it with --mpi-local-args='-x {setting.name}=...'")
    for setting in instance.env:
        value = setting.value if setting.value is not None else environ.get(setting.name)
        if value is None or setting.name not in MASTER_CHOICES:
            continue
        if setting.name == MASTER_PORT and not (value.isascii() and value.isdigit() and 1 <= int(value) <= 65535):
            raise UsageError(f"-x {MASTER_PORT}={value!r} is not a port: use a number from 1 to 65535")
        if setting.name == MASTER_ADDR and (not value or any(c.isspace() for c in value)):
            raise UsageError(f"-x {MASTER_ADDR}={value!r} is not a host name or address")
