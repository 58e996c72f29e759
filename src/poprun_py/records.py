"""The small frozen records a ``LaunchSpec`` is made of, one per stage that reads it.

Built once where the command line is read (``spec.build_spec``) or where a
function launch is set up (``functions.FunctionLaunch``); each stage of the
launch takes only the record it uses: the hosts are reached with
``ReachSettings``, the partition is sized from ``Placement`` and asked for
with ``VipuSettings``, the plan adds ``InstanceSettings`` to each instance's
environment, the job is watched with ``Supervision`` and its output routed
with ``OutputSettings``. The fabric's record is ``popdist.env.FabricSettings``
(the token is added at launch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .hosts import HostSpec, distribute_instances
from .mpiargs import EnvSetting

LOCALHOST = HostSpec("localhost")


@dataclass(frozen=True)
class Placement:
    """How many instances, replicas and IPUs, on which hosts, and whether bound to NUMA nodes."""

    num_instances: int = 1
    num_replicas: int = 1
    ipus_per_replica: int = 1
    num_ilds: int = 1
    hosts: tuple[HostSpec, ...] = ()  # none given: this host alone
    numa_aware: bool | None = None  # None: automatic (on with several instances per host)
    process_placement: str = "spreadnuma"
    #: mpirun's ``--bind-to`` from ``--mpi-*-args`` ("core", "hwthread", "numa", "none"; None: not given), and
    #: whether its ``overload-allowed`` qualifier lets cores be shared without a warning.
    bind_to: str | None = None
    bind_overload: bool = False

    @property
    def replicas_per_instance(self) -> int:
        return self.num_replicas // self.num_instances

    @property
    def num_ipus(self) -> int:
        return self.num_replicas * self.ipus_per_replica

    @property
    def ipus_per_instance(self) -> int:
        return self.replicas_per_instance * self.ipus_per_replica

    @property
    def instances_per_host(self) -> int:
        return self.num_instances // max(1, len(self.hosts))

    @property
    def numa_wanted(self) -> bool:
        """Bound at all: to NUMA nodes when asked for (``--numa-aware``, else ``--bind-to numa|none``), or
        automatically with several instances per host; to cores or hardware threads when ``--bind-to`` asks
        (``bind_unit``); never when placement is disabled."""
        if self.process_placement == "disabled":
            return False
        if self.numa_aware is not None:
            wanted = self.numa_aware
        elif self.bind_to in ("numa", "none"):
            wanted = self.bind_to == "numa"
        else:
            wanted = self.instances_per_host > 1
        return wanted or self.bind_unit is not None

    @property
    def bind_unit(self) -> str | None:
        """What each instance is bound to one of, mpirun's ``--bind-to core`` or ``hwthread`` (``numa.place``'s
        unit), unless placement is disabled; else None."""
        return self.bind_to if self.bind_to in ("core", "hwthread") and self.process_placement != "disabled" else None

    def blocks(self) -> tuple[tuple[HostSpec, range], ...]:
        """Each host with the instances it runs: contiguous blocks of the same size, in host order."""
        hosts = self.hosts or (LOCALHOST,)
        return tuple(zip(hosts, distribute_instances(len(hosts), self.num_instances)))

    def instance_hosts(self) -> list[HostSpec]:
        """The host of each instance, in index order."""
        return [host for host, block in self.blocks() for _ in block]


@dataclass(frozen=True)
class VipuSettings:
    """What the V-IPU side of a launch asks for (used when not offline)."""

    server_host: str | None = None
    server_port: int = 8090
    server_timeout: int = 10
    partition: str | None = None
    cluster: str | None = None
    allocation: str | None = None
    partition_attempts: int = 1
    update_partition: bool = False
    reset_partition: bool | None = None
    remove_partition: bool = True
    ipu_link_routing_type: str | None = None
    gw_link_routing_type: str | None = None
    sync_type: str | None = None


@dataclass(frozen=True)
class InstanceSettings:
    """What poprun adds to each instance's environment besides the contract: ``-x`` and the rest."""

    env: tuple[EnvSetting, ...] = ()  # -x of --mpi-global-args then --mpi-local-args: every instance
    instance_env: Mapping[int, tuple[EnvSetting, ...]] = field(default_factory=dict)  # --instance-mpi-local-args
    executable_cache_path: str | None = None
    compat_imports: bool = True  # horovod/mpi4py imports resolve to popdist's in the instances

    def all_settings(self) -> list[EnvSetting]:
        return [*self.env, *(setting for settings in self.instance_env.values() for setting in settings)]


@dataclass(frozen=True)
class OutputSettings:
    """How the instances' output reaches the console or files, and what poprun itself shows."""

    tag_output: bool = False  # --tag-output, or mpirun's inside --mpi-*-args
    timestamp_output: bool = False
    output_filename: str | None = None  # a directory: one file per instance and stream
    output_nocopy: bool = False  # ``DIR:nocopy``: the files only, nothing on the console
    merge_stderr: bool = False  # mpirun's --merge-stderr-to-stdout
    only_instance: int | None = None
    print_topology: bool = False
    verbosity: int = 0

    @property
    def show_topology(self) -> bool:
        return self.print_topology or self.verbosity >= 2


@dataclass(frozen=True)
class Supervision:
    """How the job is watched: the grace before SIGKILL, and its wall-clock limit."""

    stop_grace: float = 5.0
    timeout: float | None = None  # --timeout, start-up included


@dataclass(frozen=True)
class ReachSettings:
    """How the hosts are reached and where the instances start on them."""

    ssh_timeout: float = 10.0
    remote_python: str | None = None  # None: the launcher's own interpreter path
    working_dir: str | None = None  # mpirun's -wdir; None: poprun's own directory
