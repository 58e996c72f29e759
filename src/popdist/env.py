"""The environment contract between the launcher and each instance.

The variable names are spelled once, in ``popdist.env_names``, and
re-exported here; everything else imports the constants. Programs written for
Graphcore's PopRun read the ``POPDIST_*``, ``IPUOF_*`` and
``POPLAR_TARGET_OPTIONS`` names; PopTorch and Horovod read the Open MPI
names; ``torch.distributed`` reads ``RANK``/``MASTER_*``. Because there is no
MPI here, we set all of them, consistently, from one ``InstanceEnv``.

Three modules along the seams a reader follows: this one holds the record
(``InstanceEnv``, rendered as variables) and ``target_options_for``;
``popdist.env_values`` reads the variables back, one at a time, and holds
``FabricSettings``; ``popdist.env_check`` checks a record as a whole. Their
public names are re-exported here: ``popdist.env`` stays the place to import from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from popdist.env_check import check_instance_env
from popdist.env_names import *  # noqa: F401,F403 - the names are part of this module's API
from popdist.env_names import (
    DEVICE_FDS,
    EXECUTABLE_CACHE_PATH,
    FABRIC_ADDR,
    GROUP_RANK,
    GROUP_WORLD_SIZE,
    HOST_LABEL,
    IPUS_PER_REPLICA,
    JOB_ID,
    LOCAL_INSTANCE_INDEX,
    LOCAL_REPLICAS,
    MASTER_ADDR,
    MASTER_PORT,
    NODE_DEVICE_ID,
    OFFLINE,
    OMPI_LOCAL_RANK,
    OMPI_LOCAL_SIZE,
    OMPI_NODE_RANK,
    OMPI_RANK,
    OMPI_SIZE,
    RENDEZVOUS_ADDR,
    RENDEZVOUS_PORT,
    REPLICA_INDEX_OFFSET,
    ROLE_NAME,
    ROLE_RANK,
    ROLE_WORLD_SIZE,
    TARGET_OPTIONS,
    TORCH_LOCAL_RANK,
    TORCH_LOCAL_WORLD_SIZE,
    TORCH_RANK,
    TORCH_WORLD_SIZE,
    TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_RUN_ID,
    TOTAL_REPLICAS,
    UNIFORM_REPLICAS,
    VIPU_GCD_ID,
    VIPU_HOST,
    VIPU_PARTITION,
    VIPU_PORT,
    VIPU_TIMEOUT,
)
from popdist.env_values import (  # noqa: F401 - re-exported: popdist.env's API is unchanged
    DEFAULT_VIPU_HOST,
    DEFAULT_VIPU_PORT,
    DEFAULT_VIPU_TIMEOUT,
    FABRIC_TRANSPORTS,
    FIELD_VARIABLES,
    MAX_TIMEOUT_SECONDS,
    EnvContractError,
    FabricSettings,
    check_uniform_replicas,
    is_uniform_replicas,
    read_fields,
    read_int,
)
from simipu.hardware import device_id as _device_id


@dataclass(frozen=True)
class InstanceEnv:
    """What one instance is told about its place in the job.

    ``target_options`` is stored as ordered (key, value) pairs so the record
    stays hashable; a Mapping is accepted and converted. Graphcore's rules
    hold: instance index = offset // local replicas, instance count =
    total // local replicas (there is no instance-index variable).
    """

    num_total_replicas: int
    num_ipus_per_replica: int
    num_local_replicas: int
    replica_index_offset: int
    local_instance_index: int
    num_local_instances: int
    node_device_id: int
    vipu_host: str
    vipu_port: int
    vipu_partition: str
    vipu_timeout: int
    gcd_id: int = 0
    target_options: tuple[tuple[str, str], ...] = ()
    executable_cache_path: str | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    rendezvous_addr: str = "127.0.0.1"
    rendezvous_port: int = 0
    job_id: str = ""
    offline: bool = False
    host_label: str = ""
    host_index: int = 0  # the host's index among the job's hosts, in placement order (torchrun's GROUP_RANK)
    num_hosts: int = 1
    fabric_addr: str = "127.0.0.1"
    device_fds: tuple[int, ...] = ()
    fabric: FabricSettings = FabricSettings()

    def __post_init__(self) -> None:
        if isinstance(self.target_options, Mapping):
            object.__setattr__(self, "target_options", tuple(self.target_options.items()))
        else:
            object.__setattr__(self, "target_options", tuple(tuple(p) for p in self.target_options))
        check_instance_env(self)

    @property
    def instance_index(self) -> int:
        return self.replica_index_offset // self.num_local_replicas

    @property
    def num_instances(self) -> int:
        return self.num_total_replicas // self.num_local_replicas

    @property
    def num_ipus_in_partition(self) -> int:
        return self.num_total_replicas * self.num_ipus_per_replica

    @property
    def num_ipus_per_instance(self) -> int:
        return self.num_local_replicas * self.num_ipus_per_replica

    @property
    def device_id(self) -> int:
        """The Poplar id of the IPU group this instance owns."""
        return _device_id(self.num_ipus_in_partition, self.num_ipus_per_instance, self.instance_index)

    @property
    def target_options_dict(self) -> dict[str, str]:
        return dict(self.target_options)

    def render(self) -> dict[str, str]:
        """Every contract name this instance gets, mapped to its value.

        MASTER_* and POPRUN_RENDEZVOUS_* are left out while their port is 0
        (not chosen): a missing variable fails loudly, a port 0 would not.
        IPUOF_VIPU_API_HOST/_PORT are left out while ``vipu_host`` is empty:
        the embedded V-IPU service has no address, and a made-up one
        (localhost:8090) could be someone else's server.
        """
        out = {
            TOTAL_REPLICAS: str(self.num_total_replicas),
            IPUS_PER_REPLICA: str(self.num_ipus_per_replica),
            LOCAL_REPLICAS: str(self.num_local_replicas),
            UNIFORM_REPLICAS: "1",
            REPLICA_INDEX_OFFSET: str(self.replica_index_offset),
            LOCAL_INSTANCE_INDEX: str(self.local_instance_index),
            NODE_DEVICE_ID: str(self.node_device_id),
        }
        if self.executable_cache_path is not None:
            out[EXECUTABLE_CACHE_PATH] = self.executable_cache_path
        if self.vipu_host:  # "": no V-IPU server (the embedded service, or offline), so nothing to point at
            out.update({VIPU_HOST: self.vipu_host, VIPU_PORT: str(self.vipu_port)})
        out.update({
            VIPU_PARTITION: self.vipu_partition,
            VIPU_TIMEOUT: str(self.vipu_timeout),
            VIPU_GCD_ID: str(self.gcd_id),
            TARGET_OPTIONS: json.dumps(self.target_options_dict, separators=(",", ":")),
        })
        out.update(self._launchers_names())
        if self.master_port:
            out[MASTER_ADDR] = self.master_addr
            out[MASTER_PORT] = str(self.master_port)
        if self.rendezvous_port:
            out[RENDEZVOUS_ADDR] = self.rendezvous_addr
            out[RENDEZVOUS_PORT] = str(self.rendezvous_port)
        out[JOB_ID] = self.job_id
        out[OFFLINE] = "1" if self.offline else "0"
        if self.host_label:
            out[HOST_LABEL] = self.host_label
        out[FABRIC_ADDR] = self.fabric_addr
        if self.device_fds:
            out[DEVICE_FDS] = ",".join(map(str, self.device_fds))
        out.update(self.fabric.render())
        return out

    def _launchers_names(self) -> dict[str, str]:
        """The names mpirun and torchrun give a process of theirs (ranks, sizes, torchrun's group and role), so
        that programs written for either find them."""
        names = {
            OMPI_RANK: str(self.instance_index),
            OMPI_SIZE: str(self.num_instances),
            OMPI_LOCAL_RANK: str(self.local_instance_index),
            OMPI_LOCAL_SIZE: str(self.num_local_instances),
            OMPI_NODE_RANK: str(self.local_instance_index),
            TORCH_RANK: str(self.instance_index),
            TORCH_WORLD_SIZE: str(self.num_instances),
            TORCH_LOCAL_RANK: str(self.local_instance_index),
            TORCH_LOCAL_WORLD_SIZE: str(self.num_local_instances),
            GROUP_RANK: str(self.host_index),
            GROUP_WORLD_SIZE: str(self.num_hosts),
            ROLE_NAME: "default",
            ROLE_RANK: str(self.instance_index),
            ROLE_WORLD_SIZE: str(self.num_instances),
            TORCHELASTIC_RESTART_COUNT: "0",
            TORCHELASTIC_MAX_RESTARTS: "0",
        }
        if self.job_id:  # (its presence alone says "launched by torchrun": not for a record without a job)
            names[TORCHELASTIC_RUN_ID] = self.job_id
        return names

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> InstanceEnv | None:
        """Parse the contract back; None when not launched by poprun.

        Only POPDIST_NUM_TOTAL_REPLICAS is required (it marks a launch);
        other names take PopDist's documented defaults, so environments set
        by Graphcore's poprun or by hand also parse. The derived names (RANK,
        OMPI_COMM_WORLD_RANK, ...) are not read back. Raises ValueError
        naming the variable when a value is malformed or inconsistent.
        """
        if TOTAL_REPLICAS not in environ:
            return None
        check_uniform_replicas(environ)
        values = read_fields(environ)
        try:
            return cls(**values)
        except EnvContractError as exc:
            variable = FIELD_VARIABLES.get(exc.field)
            if variable is None:  # derived from several variables
                raise
            shown = environ.get(variable)
            raise EnvContractError(
                f"{variable}={shown!r} is inconsistent with the rest of the "
                f"PopDist environment: {exc}",
                exc.field, variable,
            ) from exc


def target_options_for(
    num_ipus_in_partition: int, num_ilds: int, ipus_per_instance: int, gateway_mode: bool
) -> dict[str, str]:
    """POPLAR_TARGET_OPTIONS for a partition, in the key order Graphcore's poprun logged.

    Topology and link configuration are always torus / slidingWindow, as
    every logged launch showed; we found no evidence of other values.
    """
    for name, value in (("num_ipus_in_partition", num_ipus_in_partition),
                        ("num_ilds", num_ilds), ("ipus_per_instance", ipus_per_instance)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if num_ipus_in_partition % num_ilds:
        raise ValueError(
            f"{num_ipus_in_partition} IPUs cannot be split evenly across {num_ilds} IPU-Link domains"
        )
    if num_ipus_in_partition % ipus_per_instance:
        raise ValueError(
            f"{num_ipus_in_partition} IPUs cannot be split evenly into instances of {ipus_per_instance} IPUs"
        )
    return {
        "ipuLinkDomainSize": str(num_ipus_in_partition // num_ilds),
        "ipuLinkConfiguration": "slidingWindow",
        "ipuLinkTopology": "torus",
        "gatewayMode": "true" if gateway_mode else "false",
        "instanceSize": str(ipus_per_instance),
    }


