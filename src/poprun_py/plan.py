"""The plan stage: a ``Placement`` and an ``Allocation`` become one ``InstancePlan`` per instance.

Pure: everything that needs the outside world (the launcher's environment,
a free port, the resolved program path, the device numbering of the
allocation) is passed in, so placement is testable without processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

from popdist.env import (
    COMPAT_IMPORTS,
    CONTRACT_NAMES,
    MASTER_ADDR,
    MASTER_PORT,
    FabricSettings,
    InstanceEnv,
    target_options_for,
)
from simipu.hardware import parent_device_id

from .hosts import HostSpec
from .mpiargs import EnvSetting
from .records import LOCALHOST, InstanceSettings, Placement, VipuSettings
from .validate import MASTER_CHOICES

log = logging.getLogger("poprun.plan")

__all__ = ["LOCALHOST", "Allocation", "InstancePlan", "Plan", "make_plan", "offline_allocation", "plan_hosts",
           "plan_instances"]
OMP_NUM_THREADS = "OMP_NUM_THREADS"


def omp_threads(num_cpus: int, instances_on_host: int) -> int:
    """Each instance's share of its host's CPUs (at least 1), as torchrun sets OMP_NUM_THREADS."""
    return max(1, num_cpus // max(1, instances_on_host))


@dataclass(frozen=True)
class Allocation:
    """The IPUs a launch runs on: a V-IPU partition, or none in offline mode."""

    partition: str
    node_device_id: int
    server_host: str  # "": no V-IPU server (the embedded service, or offline)
    server_port: int
    server_timeout: int
    gateway_mode: bool
    offline: bool


@dataclass(frozen=True)
class InstancePlan:
    """One instance: where it runs, what it runs, what poprun adds to its environment."""

    index: int
    host: HostSpec
    local_index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    pass_fds: tuple[int, ...] = ()  # descriptors the instance inherits (its device's IPU locks)
    cpus: tuple[int, ...] | None = None  # CPUs it is bound to (NUMA placement); None: unbound


@dataclass(frozen=True)
class Plan:
    job_id: str
    hosts: tuple[HostSpec, ...]
    instances: tuple[InstancePlan, ...]


def offline_allocation(placement: Placement, vipu: VipuSettings) -> Allocation:
    """What instances are told when no IPUs are attached (``--offline-mode``)."""
    return Allocation(
        partition=vipu.partition or "offline",
        node_device_id=parent_device_id(placement.num_ipus),
        server_host=vipu.server_host or "",  # none named: instances are told of none
        server_port=vipu.server_port,
        server_timeout=vipu.server_timeout,
        gateway_mode=False,
        offline=True,
    )


def _resolve_env_settings(
    settings: Sequence[EnvSetting], launcher_environ: Mapping[str, str], warned: set[str]
) -> dict[str, str]:
    """``-x NAME=VALUE`` sets; ``-x NAME`` forwards the launcher's value (warn once if it has none)."""
    result: dict[str, str] = {}
    for setting in settings:
        if setting.value is not None:
            result[setting.name] = setting.value
        elif setting.name in launcher_environ:
            result[setting.name] = launcher_environ[setting.name]
        elif setting.name not in warned:
            warned.add(setting.name)
            log.warning("-x %s: the variable is not set in poprun's environment, so there is nothing to forward", setting.name)
    return result


def _with_chosen_master(job_contract: partial[InstanceEnv], shared: Mapping[str, str]) -> partial[InstanceEnv]:
    """A job-wide ``-x MASTER_ADDR=...`` / ``-x MASTER_PORT=N`` replaces poprun's choice (torchrun's
    ``--master-addr``/``--master-port``, for a port a firewall lets through); ``validate.check_master_choice``
    has checked the values and refused them per instance."""
    chosen: dict[str, Any] = {}
    if MASTER_ADDR in shared:
        chosen["master_addr"] = shared[MASTER_ADDR]
    if MASTER_PORT in shared:
        chosen["master_port"] = int(shared[MASTER_PORT])
    return partial(job_contract, **chosen) if chosen else job_contract


def _omp_setting(host: HostSpec, instances_on_host: int, user_env: Mapping[str, str],
                 launcher_environ: Mapping[str, str], host_cpus: Mapping[str, int], said: set[str]) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for an instance sharing its host, unless the user chose it (said once at -v)."""
    if instances_on_host < 2 or OMP_NUM_THREADS in user_env:
        return {}
    if OMP_NUM_THREADS in launcher_environ:  # the user's, kept; remote hosts get it too, not their own share
        return {} if str(host) in host_cpus else {OMP_NUM_THREADS: launcher_environ[OMP_NUM_THREADS]}
    if str(host) not in host_cpus:
        return {}
    threads = omp_threads(host_cpus[str(host)], instances_on_host)
    if OMP_NUM_THREADS not in said:
        said.add(OMP_NUM_THREADS)
        log.info("%s=%d for each of the %d instances on %s (their share of %d CPUs); set %s yourself or with "
                 "-x %s=N to choose", OMP_NUM_THREADS, threads, instances_on_host, host, host_cpus[str(host)],
                 OMP_NUM_THREADS, OMP_NUM_THREADS)
    return {OMP_NUM_THREADS: str(threads)}


def _job_contract(placement: Placement, cache_path: str | None, allocation: Allocation, master: tuple[str, int],
                  job_id: str, rendezvous: tuple[str, int], fabric: FabricSettings) -> partial[InstanceEnv]:
    """``InstanceEnv`` with what every instance of the job shares bound once; each instance adds its place."""
    target_options = target_options_for(placement.num_ipus, placement.num_ilds, placement.ipus_per_instance,
                                        allocation.gateway_mode)
    return partial(
        InstanceEnv,
        num_total_replicas=placement.num_replicas,
        num_ipus_per_replica=placement.ipus_per_replica,
        num_local_replicas=placement.replicas_per_instance,
        node_device_id=allocation.node_device_id,
        vipu_host=allocation.server_host,
        vipu_port=allocation.server_port,
        vipu_partition=allocation.partition,
        vipu_timeout=allocation.server_timeout,
        target_options=tuple(target_options.items()),
        executable_cache_path=cache_path,
        master_addr=master[0],
        master_port=master[1],
        job_id=job_id,
        offline=allocation.offline,
        rendezvous_addr=rendezvous[0],
        rendezvous_port=rendezvous[1],
        fabric=fabric,
    )


@dataclass(frozen=True)
class Programs:
    """What instances run: ``here`` on hosts poprun starts them on, ``typed`` (found by their agent) elsewhere."""

    here: tuple[str, ...]
    typed: tuple[str, ...] = ()
    remote_hosts: frozenset[str] = frozenset()  # hosts (``str(host)``) whose instances an agent starts
    #: The program of each instance started here, as found with its own PATH (``planning.find_programs``);
    #: an instance not in it runs ``here``.
    found: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def of(self, index: int, host: HostSpec) -> tuple[str, ...]:
        return self.typed if str(host) in self.remote_hosts else self.found.get(index, self.here)


def make_plan(placement: Placement, settings: InstanceSettings, **options: Any) -> Plan:
    """Give each instance, on the host ``placement`` puts it on, its command and environment: ``plan_instances``
    (which takes these ``options``), all of them at once, since a launch needs every instance's before it starts
    any."""
    instances = tuple(plan_instances(placement, settings, **options))
    return Plan(options["job_id"], plan_hosts(placement), instances)


def plan_hosts(placement: Placement) -> tuple[HostSpec, ...]:
    """The hosts of a plan, in order: the placement's, or this host alone."""
    return tuple(host for host, _ in placement.blocks())


def plan_instances(
    placement: Placement,
    settings: InstanceSettings,
    *,
    programs: Programs,
    job_id: str,
    allocation: Allocation,
    master_port: int,
    launcher_environ: Mapping[str, str],
    cwd: str,
    rendezvous: tuple[str, int] = ("127.0.0.1", 0),
    fabric: FabricSettings = FabricSettings(),
    device_fds: Mapping[int, tuple[int, ...]] = MappingProxyType({}),
    cpus: Mapping[int, tuple[int, ...]] = MappingProxyType({}),
    addresses: Mapping[str, str] = MappingProxyType({}),
    host_cpus: Mapping[str, int] = MappingProxyType({}),
) -> Iterator[InstancePlan]:
    """Each instance's plan in index order, made as it is asked for: ``--dry-run`` prints one before the next
    is made, so its memory does not grow with the instances.

    ``addresses`` maps a host (as ``str(host)``) to the address its instances
    are reached at from other hosts; hosts not in it are on loopback.
    ``host_cpus`` maps a host to the CPUs poprun may use there: with several
    instances on it, each gets ``OMP_NUM_THREADS`` (its share) unless the user
    set it (in poprun's environment or with ``-x``); a remote host's agent
    does the same there (see ``executors/agent.py``).
    """
    blocks = placement.blocks()
    first = blocks[0][0]
    master_addr = addresses.get(str(first), "127.0.0.1" if first.is_local else first.name)
    job_contract = _job_contract(placement, settings.executable_cache_path, allocation, (master_addr, master_port),
                                 job_id, rendezvous, fabric)
    warned: set[str] = set()
    shared = _resolve_env_settings(settings.env, launcher_environ, warned)
    job_contract = _with_chosen_master(job_contract, shared)
    for host_index, (host, block) in enumerate(blocks):
        for local_index, index in enumerate(block):
            user_env = {**shared, **_resolve_env_settings(settings.instance_env.get(index, ()), launcher_environ, warned)}
            overridden = sorted(set(user_env) & set(CONTRACT_NAMES) - MASTER_CHOICES)
            if overridden and index == 0:
                log.warning("-x cannot change %s: poprun sets them for each instance", ", ".join(overridden))
            contract = job_contract(
                replica_index_offset=index * placement.replicas_per_instance,
                local_instance_index=local_index,
                num_local_instances=len(block),
                host_label=host.name,
                host_index=host_index,
                num_hosts=len(blocks),
                fabric_addr=addresses.get(str(host), "127.0.0.1"),
                device_fds=device_fds.get(index, ()),
            )
            env = {**user_env, **_omp_setting(host, len(block), user_env, launcher_environ, host_cpus, warned),
                   **contract.render(), COMPAT_IMPORTS: "1" if settings.compat_imports else "0"}
            yield InstancePlan(index, host, local_index, programs.of(index, host), MappingProxyType(env), cwd,
                               device_fds.get(index, ()), cpus.get(index))
