"""What the plan stage asks of this host before the pure ``plan.make_plan``.

A free port for torch.distributed's store, the executable cache directory,
the program each instance runs, the CPUs poprun may use and the NUMA nodes instances are bound to: the
launch asks here once, and ``--dry-run`` shows the same CPUs without
picking a port.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Callable, Collection, Iterator, Mapping, Sequence, TypeVar

from popdist.env import FabricSettings

from .errors import UsageError
from .plan import Allocation, Plan, Programs, make_plan
from .programs import resolve_program
from .records import LOCALHOST, InstanceSettings, Placement

log = logging.getLogger("poprun")
_V = TypeVar("_V")


def free_port() -> int:
    """A TCP port for torch.distributed's store; instance 0 binds it (as torchrun does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare_cache(path: str | None) -> None:
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--executable-cache-path: cannot create {path!r}: {exc.strerror}") from None


def instance_path(settings: InstanceSettings, index: int, environ: Mapping[str, str]) -> str | None:
    """The PATH instance ``index`` starts with: the last ``-x PATH`` for it (global and local, then its own;
    ``-x PATH`` alone forwards poprun's), else poprun's own (``make_plan`` builds its environment the same way)."""
    path = environ.get("PATH")
    for setting in (*settings.env, *settings.instance_env.get(index, ())):
        if setting.name == "PATH" and (setting.value is not None or "PATH" in environ):
            path = setting.value if setting.value is not None else environ["PATH"]
    return path


class PerInstance(Mapping[int, _V]):
    """A value for each instance of the ``local`` blocks (``Placement.blocks``: contiguous, of one size), made
    when asked: the plan's programs and CPUs of every instance here, without a dict of them all (a dry run may
    list a million instances)."""

    def __init__(self, value: Callable[[int], _V], local: Sequence[range]) -> None:
        self._value = value
        self._local = tuple(local)
        self._starts = frozenset(block.start for block in self._local)
        self._size = max(1, len(self._local[0])) if self._local else 1

    def __getitem__(self, index: int) -> _V:
        if not isinstance(index, int) or index < 0 or index - index % self._size not in self._starts:
            raise KeyError(index)
        return self._value(index)

    def __iter__(self) -> Iterator[int]:
        return (index for block in self._local for index in block)

    def __len__(self) -> int:
        return sum(len(block) for block in self._local)


def find_programs(program: Sequence[str], placement: Placement, settings: InstanceSettings,
                  environ: Mapping[str, str], cwd: str) -> Mapping[int, tuple[str, ...]]:
    """The program of each instance this host starts, found with that instance's own PATH, before anything starts.

    Open MPI searches the PATH of the app's environment, ``-x PATH=...`` applied, and each app context
    (each instance, with ``--instance-mpi-local-args``) with its own; remote agents do the same on
    their hosts. Searched once per distinct PATH, in the order of the instances first using each (the error
    names a PATH that is not poprun's); only instances with settings of their own can differ from the first
    of the others, so only those are looked at, however many instances there are.
    """
    local = tuple(block for host, block in placement.blocks() if host.is_local)
    own = {index for index in settings.instance_env if any(index in block for block in local)}
    plain = next((index for block in local for index in block if index not in own), None)
    found: dict[str | None, str] = {}
    for index in sorted(own | ({plain} if plain is not None else set())):
        path = instance_path(settings, index, environ)
        if path not in found:
            searched = "PATH" if path == environ.get("PATH") else f"instance {index}'s PATH (set with -x)"
            found[path] = resolve_program(program[0], {} if path is None else {"PATH": path}, cwd, searched)
    resolved = {index: found[instance_path(settings, index, environ)] for index in own}
    default = found[instance_path(settings, plain, environ)] if plain is not None else program[0]
    return PerInstance(lambda index: (resolved.get(index, default), *program[1:]), local)


def local_host_cpus(placement: Placement, remote_hosts: Collection[str] = ()) -> dict[str, int]:
    """The CPUs poprun may use, for each host whose instances start from here (agents count their own)."""
    cpus = len(os.sched_getaffinity(0))
    return {str(host): cpus for host in placement.hosts or (LOCALHOST,) if str(host) not in remote_hosts}


def numa_binding(placement: Placement, remote_hosts: Collection[str] = ()) -> Mapping[int, tuple[int, ...]]:
    """CPUs per instance on this host: a NUMA node's, or a core's or one (``--bind-to core|hwthread``). None for
    the instances of ``remote_hosts``: their agents place them on their own hosts' nodes (before, this host's
    CPUs were shown for them by --print-topology and --dry-run, a binding that did not exist)."""
    if not placement.numa_wanted:
        return {}
    per_host = placement.instances_per_host
    from .numa import local_placement

    try:
        cpus = local_placement(per_host, placement.bind_unit, placement.bind_overload)
    except ValueError as exc:
        log.warning("NUMA placement is off: %s", exc)
        return {}
    local = [block for host, block in placement.blocks() if str(host) not in remote_hosts]
    return PerInstance(lambda index: cpus[index % per_host][1], local)


def plan_job(
    placement: Placement,
    settings: InstanceSettings,
    programs: Programs,
    *,
    job_id: str,
    allocation: Allocation,
    fabric: FabricSettings,
    rendezvous: tuple[str, int],
    cwd: str,
    environ: Mapping[str, str],
    addresses: Mapping[str, str] = {},
    device_fds: Mapping[int, tuple[int, ...]] = {},
) -> Plan:
    """The plan of a launch that is starting: the port is picked and the cache directory made now."""
    prepare_cache(settings.executable_cache_path)
    return make_plan(
        placement,
        settings,
        programs=programs,
        job_id=job_id,
        allocation=allocation,
        master_port=free_port(),
        launcher_environ=environ,
        cwd=cwd,
        rendezvous=rendezvous,
        fabric=fabric,
        device_fds=device_fds,
        cpus=numa_binding(placement, programs.remote_hosts),
        addresses=addresses,
        host_cpus=local_host_cpus(placement, programs.remote_hosts),
    )
