"""How a launch reaches its hosts: directly, over SSH, or with srun inside a Slurm allocation.

Before anything is planned, every host that is not this one gets an agent,
started and greeted (the SSH pre-flight, or srun), so a bad host fails the
launch before a partition is created or an instance started. The addresses
the agents were reached by decide where the fabric listens: instances on a
remote host bind the address the launcher reached it at, those on this host
the address the remote hosts see the launcher at.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

from popdist.env import CONSOLE_IS_TERMINAL, SOFT_DEFAULTS, VIPU_HOST, VIPU_PORT

from .errors import UsageError
from .hosts import HostSpec
from .records import Placement, ReachSettings
from .validate import current_directory

if TYPE_CHECKING:  # the channel code loads with the agents, not for a launch on this host alone
    from .executors.channels import AgentChannel

log = logging.getLogger("poprun.reach")
LOOPBACK = "127.0.0.1"
#: Forwarded to remote hosts' instances as mpirun's ``--prefix`` would set them, so the same program is found.
FORWARDED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")


class ReachedHost(Protocol):
    """A host with a greeted agent at the end of ``channel``."""

    @property
    def channel(self) -> AgentChannel: ...  # read-only members: a host's channel may be a subtype
    @property
    def address(self) -> str: ...
    @property
    def local_address(self) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Reach:
    """The agents of a launch, by host label, and where each host's instances listen."""

    agents: Mapping[str, ReachedHost] = field(default_factory=dict)
    addresses: Mapping[str, str] = field(default_factory=dict)
    rendezvous_bind: str = LOOPBACK
    rendezvous_address: str = LOOPBACK
    via_srun: bool = False  # the agents are srun steps: instances get their own Slurm task variables

    def close(self) -> None:
        for host in self.agents.values():
            host.close()


def in_slurm_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID")) and bool(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))


def with_allocation_hosts(placement: Placement, environ: Mapping[str, str]) -> tuple[Placement, bool]:
    """Inside a Slurm allocation and without ``-H``, the allocation's nodes are the hosts (reached by srun)."""
    if placement.hosts or not in_slurm_allocation(environ):
        return placement, False
    from .executors.slurm import allocation_hosts

    nodes = allocation_hosts(environ)
    num_instances = placement.num_instances
    hosts = nodes[: min(len(nodes), num_instances)]
    if num_instances % len(hosts):
        raise UsageError(f"--num-instances {num_instances} cannot be divided evenly among the {len(hosts)} "
                         f"nodes of Slurm job {environ['SLURM_JOB_ID']}; use a multiple of {len(hosts)}, "
                         "or choose hosts with -H")
    slots = sum(h.slots or 1 for h in hosts)
    if num_instances > slots:
        log.warning("%d instances on %d Slurm task slots: the nodes are oversubscribed", num_instances, slots)
    log.info("Slurm job %s: running on %s", environ["SLURM_JOB_ID"], ", ".join(str(h) for h in hosts))
    return dataclasses.replace(placement, hosts=hosts), True


def reach_hosts(hosts: tuple[HostSpec, ...], settings: ReachSettings, cwd: str, via_srun: bool) -> Reach:
    """Agents on every host that needs one, checked in parallel; ``PreflightFailed`` names each bad host."""
    python = settings.remote_python or sys.executable
    if via_srun:
        from .executors.slurm import start_agents

        agents: Mapping[str, ReachedHost] = start_agents(hosts, python=python, cwd=cwd, timeout=settings.ssh_timeout)
    else:
        remote = [h for h in hosts if not h.is_local]
        if not remote:
            return Reach()
        from .executors.ssh import check_hosts

        agents = check_hosts(remote, python=python, cwd=cwd, timeout=settings.ssh_timeout)
    here, bind = rendezvous_address({host.local_address for host in agents.values()})
    addresses = {str(h): agents[str(h)].address if str(h) in agents else here for h in hosts}
    return Reach(agents, addresses, bind, here, via_srun)


def rendezvous_address(local_addresses: set[str]) -> tuple[str, str]:
    """The address the instances reach the rendezvous by, and the one it listens on ("": all), from this host's
    address towards each agent's host: not a loopback one while there is another (the node poprun runs on has
    an agent too inside Slurm, reached over loopback), which no other host could reach; several networks:
    listen on all, answer with one."""
    reachable = {address for address in local_addresses if not _is_loopback(address)} or local_addresses
    here = sorted(reachable)[0]
    return here, here if len(reachable) == 1 else ""


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:  # (a name)
        return False


def forwarded_environment(environ: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """What remote instances get from the launcher's environment besides the contract and ``-x``."""
    forwarded = {name: environ[name] for name in FORWARDED_NAMES if name in environ}
    return {**{k: environ.get(k, v) for k, v in defaults.items()}, **forwarded}


def base_environment(here: bool, environ: Mapping[str, str], console_is_terminal: bool) -> dict[str, str]:
    """What an instance's environment starts from, before its plan's (which wins): on this host poprun's own
    (less an outer launch's V-IPU server: the plan names this job's) over the soft defaults; on an agent's host
    the names forwarded there over them; and whether poprun's console is a terminal (the instances' stdout is
    a pipe). The launch starts from it, and ``--dry-run`` lists what it adds."""
    if here:
        base = {**SOFT_DEFAULTS, **{k: v for k, v in environ.items() if k not in (VIPU_HOST, VIPU_PORT)}}
    else:
        base = forwarded_environment(environ, SOFT_DEFAULTS)
    return {**base, CONSOLE_IS_TERMINAL: "1" if console_is_terminal else "0"}


def check_working_dir(settings: ReachSettings, hosts: tuple[HostSpec, ...]) -> str:
    """The instances' directory: ``-wdir`` or poprun's own; on this host it must exist now."""
    cwd = settings.working_dir or current_directory()
    if any(h.is_local for h in hosts) or not hosts:
        if not os.path.isdir(cwd):
            raise UsageError(f"-wdir {cwd}: no such directory")
    return os.path.abspath(cwd) if os.path.isdir(cwd) else cwd
