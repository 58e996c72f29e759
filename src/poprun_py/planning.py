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
from pathlib import Path
from typing import Collection, Mapping, Sequence

from popdist.env import FabricSettings

from .errors import UsageError
from .plan import Allocation, Plan, Programs, make_plan
from .programs import resolve_program
from .records import LOCALHOST, InstanceSettings, Placement

log = logging.getLogger("poprun")


def free_port() -> int:
    """A TCP port for torch.distributed's store; instance 0 binds it (as torchrun does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare_cache(path: str | None) -> None:
    if path is None:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
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


def find_programs(program: Sequence[str], placement: Placement, settings: InstanceSettings,
                  environ: Mapping[str, str], cwd: str) -> dict[int, tuple[str, ...]]:
    """The program of each instance this host starts, found with that instance's own PATH, before anything starts.

    Open MPI searches the PATH of the app's environment, ``-x PATH=...`` applied, and each app context
    (each instance, with ``--instance-mpi-local-args``) with its own; remote agents do the same on
    their hosts. Searched once per distinct PATH; the error names a PATH that is not poprun's.
    """
    found: dict[str | None, str] = {}
    programs: dict[int, tuple[str, ...]] = {}
    for index, host in enumerate(placement.instance_hosts()):
        if not host.is_local:
            continue
        path = instance_path(settings, index, environ)
        if path not in found:
            searched = "PATH" if path == environ.get("PATH") else f"instance {index}'s PATH (set with -x)"
            found[path] = resolve_program(program[0], {} if path is None else {"PATH": path}, cwd, searched)
        programs[index] = (found[path], *program[1:])
    return programs


def local_host_cpus(placement: Placement, remote_hosts: Collection[str] = ()) -> dict[str, int]:
    """The CPUs poprun may use, for each host whose instances start from here (agents count their own)."""
    cpus = len(os.sched_getaffinity(0))
    return {str(host): cpus for host in placement.hosts or (LOCALHOST,) if str(host) not in remote_hosts}


def numa_binding(placement: Placement, remote_hosts: Collection[str] = ()) -> dict[int, tuple[int, ...]]:
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
    remote = {index for host, block in placement.blocks() if str(host) in remote_hosts for index in block}
    return {index: cpus[index % per_host][1] for index in range(placement.num_instances) if index not in remote}


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
