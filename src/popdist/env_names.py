"""Every environment variable name of the launcher-instance contract, spelled once.

``popdist.env`` re-exports these; nothing else in the project spells them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# --- PopDist (Graphcore) ---------------------------------------------------
TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
NODE_DEVICE_ID = "POPDIST_NODE_DEVICE_ID"
EXECUTABLE_CACHE_PATH = "POPDIST_EXECUTABLE_CACHE_PATH"
# --- IPU over Fabric: the V-IPU service and partition -----------------------
VIPU_HOST = "IPUOF_VIPU_API_HOST"
VIPU_PORT = "IPUOF_VIPU_API_PORT"
VIPU_PARTITION = "IPUOF_VIPU_API_PARTITION_ID"
VIPU_TIMEOUT = "IPUOF_VIPU_API_TIMEOUT"
VIPU_GCD_ID = "IPUOF_VIPU_API_GCD_ID"
IPUOF_LOG_LEVEL = "IPUOF_LOG_LEVEL"
TARGET_OPTIONS = "POPLAR_TARGET_OPTIONS"
# --- Open MPI names (PopTorch, Horovod) --------------------------------------
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"
OMPI_NODE_RANK = "OMPI_COMM_WORLD_NODE_RANK"
# --- torch.distributed --------------------------------------------------------
TORCH_RANK = "RANK"
TORCH_WORLD_SIZE = "WORLD_SIZE"
TORCH_LOCAL_RANK = "LOCAL_RANK"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# --- torchrun's (torch.distributed.elastic) other names: a fixed worker group, never restarted -------
GROUP_RANK = "GROUP_RANK"  # the host's index among the job's hosts (torchrun's node rank)
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # the number of hosts
ROLE_NAME = "ROLE_NAME"  # "default": poprun's instances have one role
ROLE_RANK = "ROLE_RANK"  # = RANK (one role)
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"  # = WORLD_SIZE
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # the job id; its presence is torch's is_torchelastic_launched()
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # "0": poprun never restarts instances
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"  # "0"
# --- ours ---------------------------------------------------------------------
RENDEZVOUS_ADDR = "POPRUN_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT = "POPRUN_RENDEZVOUS_PORT"
JOB_ID = "POPRUN_JOB_ID"
OFFLINE = "POPRUN_OFFLINE"
HOST_LABEL = "POPRUN_HOST"  # the host this instance was placed on, as the launcher names it
FABRIC_ADDR = "POPRUN_FABRIC_ADDR"  # the address peers on other hosts reach this instance at
JOB_TOKEN = "POPRUN_JOB_TOKEN"  # the fabric's per-job secret: environment only, never argv or logs
DEVICE_FDS = "POPRUN_DEVICE_FDS"  # inherited IPU locks: the instance's device, held from its first instant
FABRIC_TRANSPORT = "POPRUN_FABRIC_TRANSPORT"
FABRIC_TIMEOUT = "POPRUN_FABRIC_TIMEOUT"
STARTUP_TIMEOUT = "POPRUN_STARTUP_TIMEOUT"
COMPAT_IMPORTS = "POPRUN_COMPAT_IMPORTS"  # "0": horovod/mpi4py imports are not mapped to popdist's (poprun --compat-imports=no)
CONSOLE_IS_TERMINAL = "POPRUN_CONSOLE_IS_TERMINAL"  # "1" when poprun's stdout is a terminal: instances may draw progress bars

CONTRACT_NAMES: tuple[str, ...] = (
    TOTAL_REPLICAS, IPUS_PER_REPLICA, LOCAL_REPLICAS, UNIFORM_REPLICAS,
    REPLICA_INDEX_OFFSET, LOCAL_INSTANCE_INDEX, NODE_DEVICE_ID,
    EXECUTABLE_CACHE_PATH,
    VIPU_HOST, VIPU_PORT, VIPU_PARTITION, VIPU_TIMEOUT, VIPU_GCD_ID,
    IPUOF_LOG_LEVEL, TARGET_OPTIONS,
    OMPI_RANK, OMPI_SIZE, OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE, OMPI_NODE_RANK,
    TORCH_RANK, TORCH_WORLD_SIZE, TORCH_LOCAL_RANK, TORCH_LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT,
    GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,
    TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
    RENDEZVOUS_ADDR, RENDEZVOUS_PORT, JOB_ID, OFFLINE,
    HOST_LABEL, FABRIC_ADDR, JOB_TOKEN, DEVICE_FDS, FABRIC_TRANSPORT, FABRIC_TIMEOUT, STARTUP_TIMEOUT,
    CONSOLE_IS_TERMINAL, COMPAT_IMPORTS,
)
"""Every name this contract may set; clear them all to simulate 'not under poprun'."""

SOFT_DEFAULTS: Mapping[str, str] = MappingProxyType({IPUOF_LOG_LEVEL: "WARN"})
"""Names Graphcore's poprun set that are the user's choice: the launcher
applies these only when the user's environment lacks them (render() never
includes them, so it cannot override a user's setting)."""
