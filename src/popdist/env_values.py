"""Reading the environment contract: each variable alone, then all of ``InstanceEnv``'s fields.

A malformed variable raises ``EnvContractError`` naming itself, before the
fields are checked together (``env_check``). The fabric's few variables are
read and rendered as one record, ``FabricSettings``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from popdist.env_names import (
    DEVICE_FDS,
    EXECUTABLE_CACHE_PATH,
    FABRIC_ADDR,
    FABRIC_TIMEOUT,
    FABRIC_TRANSPORT,
    GROUP_RANK,
    GROUP_WORLD_SIZE,
    HOST_LABEL,
    IPUS_PER_REPLICA,
    JOB_ID,
    JOB_TOKEN,
    LOCAL_INSTANCE_INDEX,
    LOCAL_REPLICAS,
    MASTER_ADDR,
    MASTER_PORT,
    NODE_DEVICE_ID,
    OFFLINE,
    OMPI_LOCAL_SIZE,
    RENDEZVOUS_ADDR,
    RENDEZVOUS_PORT,
    REPLICA_INDEX_OFFSET,
    STARTUP_TIMEOUT,
    TARGET_OPTIONS,
    TORCH_LOCAL_WORLD_SIZE,
    TOTAL_REPLICAS,
    UNIFORM_REPLICAS,
    VIPU_GCD_ID,
    VIPU_HOST,
    VIPU_PARTITION,
    VIPU_PORT,
    VIPU_TIMEOUT,
)
from simipu.durations import MAX_SECONDS
from simipu.hardware import parent_device_id as _parent_device_id

DEFAULT_VIPU_HOST = "localhost"
DEFAULT_VIPU_PORT = 8090
DEFAULT_VIPU_TIMEOUT = 10  # seconds, poprun's --vipu-server-timeout default

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


class EnvContractError(ValueError):
    """A value that breaks the contract; names the field and, if parsed, the variable."""

    def __init__(self, message: str, field: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.variable = variable


FABRIC_TRANSPORTS = ("auto", "tcp")
#: The longest timeout an instance can wait with: poll/epoll take milliseconds in a C int (2**31 ms, ~24.8 days).
MAX_TIMEOUT_SECONDS = MAX_SECONDS  # simipu's rule for every duration, one number for all floors


@dataclass(frozen=True)
class FabricSettings:
    """How an instance joins the job's collectives fabric (our names, POPRUN_*)."""

    token: str = field(default="", repr=False)
    transport: str = "auto"
    timeout: float = 10.0
    startup_timeout: float = 60.0

    def render(self) -> dict[str, str]:
        if not self.token:
            return {}
        return {
            JOB_TOKEN: self.token,
            FABRIC_TRANSPORT: self.transport,
            FABRIC_TIMEOUT: f"{self.timeout:g}",
            STARTUP_TIMEOUT: f"{self.startup_timeout:g}",
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FabricSettings:
        transport = environ.get(FABRIC_TRANSPORT, "auto")
        if transport not in FABRIC_TRANSPORTS:
            raise EnvContractError(f"{FABRIC_TRANSPORT}={transport!r} is not one of {FABRIC_TRANSPORTS}",
                                   "transport", FABRIC_TRANSPORT)
        return cls(environ.get(JOB_TOKEN, ""), transport, read_seconds(environ, FABRIC_TIMEOUT, 10.0),
                   read_seconds(environ, STARTUP_TIMEOUT, 60.0))


def read_fds(environ: Mapping[str, str]) -> tuple[int, ...]:
    text = environ.get(DEVICE_FDS, "").strip()
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise EnvContractError(f"{DEVICE_FDS}={text!r} is not a comma-separated list of descriptors",
                               "device_fds", DEVICE_FDS) from None


def read_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise EnvContractError(f"{name}={text!r} is not a number of seconds", name, name) from None
    if not 0 < value <= MAX_TIMEOUT_SECONDS:  # also refuses nan and inf
        raise EnvContractError(
            f"{name}={text!r} must be more than 0 and at most {MAX_TIMEOUT_SECONDS:.0f} seconds", name, name)
    return value


def read_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """Parse one integer variable, default when absent; ValueError naming it when malformed."""
    raw = environ.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise EnvContractError(f"{name}={raw!r} is not an integer", name, name)
    return int(raw)


def is_uniform_replicas(environ: Mapping[str, str]) -> bool:
    """True unless POPDIST_UNIFORM_REPLICAS_PER_INSTANCE says otherwise (PopDist's default)."""
    raw = environ.get(UNIFORM_REPLICAS)
    if raw is None:
        return True
    raw = raw.strip()
    if raw not in ("0", "1"):
        raise EnvContractError(f"{UNIFORM_REPLICAS}={raw!r} is not 0 or 1", UNIFORM_REPLICAS, UNIFORM_REPLICAS)
    return raw == "1"


FIELD_VARIABLES = {
    "num_total_replicas": TOTAL_REPLICAS,
    "num_ipus_per_replica": IPUS_PER_REPLICA,
    "num_local_replicas": LOCAL_REPLICAS,
    "replica_index_offset": REPLICA_INDEX_OFFSET,
    "local_instance_index": LOCAL_INSTANCE_INDEX,
    "num_local_instances": OMPI_LOCAL_SIZE,
    "node_device_id": NODE_DEVICE_ID,
    "vipu_host": VIPU_HOST,
    "vipu_port": VIPU_PORT,
    "vipu_partition": VIPU_PARTITION,
    "vipu_timeout": VIPU_TIMEOUT,
    "gcd_id": VIPU_GCD_ID,
    "target_options": TARGET_OPTIONS,
    "executable_cache_path": EXECUTABLE_CACHE_PATH,
    "master_addr": MASTER_ADDR,
    "master_port": MASTER_PORT,
    "rendezvous_addr": RENDEZVOUS_ADDR,
    "rendezvous_port": RENDEZVOUS_PORT,
    "job_id": JOB_ID,
    "host_index": GROUP_RANK,
    "num_hosts": GROUP_WORLD_SIZE,
}


def check_uniform_replicas(environ: Mapping[str, str]) -> None:
    """Only a uniform number of replicas per instance is supported (PopDist's default, "1")."""
    uniform = environ.get(UNIFORM_REPLICAS, "1").strip()
    if uniform == "0":
        raise EnvContractError(
            f"{UNIFORM_REPLICAS}=0: a non-uniform number of replicas per "
            "instance is not supported; launch with --num-replicas a "
            "multiple of --num-instances",
            "num_local_replicas", UNIFORM_REPLICAS,
        )
    if uniform != "1":
        raise EnvContractError(
            f"{UNIFORM_REPLICAS}={uniform!r} is not 0 or 1", "num_local_replicas", UNIFORM_REPLICAS
        )


def read_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """``InstanceEnv``'s fields as the environment gives them (absent: PopDist's defaults), keyword by
    keyword; a malformed variable raises here, naming itself, before the fields are checked together."""
    total = read_int(environ, TOTAL_REPLICAS, 1)
    ipus = read_int(environ, IPUS_PER_REPLICA, 1)
    local_index = read_int(environ, LOCAL_INSTANCE_INDEX, 0)
    if OMPI_LOCAL_SIZE in environ:
        local_count = read_int(environ, OMPI_LOCAL_SIZE, 1)
    else:  # unknown: the least count consistent with the index
        local_count = read_int(environ, TORCH_LOCAL_WORLD_SIZE, max(local_index, 0) + 1)
    if NODE_DEVICE_ID in environ or total < 1 or ipus < 1:
        node_device_id = read_int(environ, NODE_DEVICE_ID, 0)
    else:
        node_device_id = _parent_device_id(total * ipus)
    return dict(
        num_total_replicas=total,
        num_ipus_per_replica=ipus,
        num_local_replicas=read_int(environ, LOCAL_REPLICAS, 1),
        replica_index_offset=read_int(environ, REPLICA_INDEX_OFFSET, 0),
        local_instance_index=local_index,
        num_local_instances=local_count,
        node_device_id=node_device_id,
        vipu_host=environ.get(VIPU_HOST, DEFAULT_VIPU_HOST),
        vipu_port=read_int(environ, VIPU_PORT, DEFAULT_VIPU_PORT),
        vipu_partition=environ.get(VIPU_PARTITION, ""),
        vipu_timeout=read_int(environ, VIPU_TIMEOUT, DEFAULT_VIPU_TIMEOUT),
        gcd_id=read_int(environ, VIPU_GCD_ID, 0),
        target_options=read_target_options(environ),
        executable_cache_path=environ.get(EXECUTABLE_CACHE_PATH) or None,
        master_addr=environ.get(MASTER_ADDR, "127.0.0.1"),
        master_port=read_int(environ, MASTER_PORT, 0),
        rendezvous_addr=environ.get(RENDEZVOUS_ADDR, "127.0.0.1"),
        rendezvous_port=read_int(environ, RENDEZVOUS_PORT, 0),
        job_id=environ.get(JOB_ID, ""),
        offline=read_flag(environ, OFFLINE),
        host_label=environ.get(HOST_LABEL, ""),
        host_index=read_int(environ, GROUP_RANK, 0),
        num_hosts=read_int(environ, GROUP_WORLD_SIZE, 1),
        fabric_addr=environ.get(FABRIC_ADDR, "127.0.0.1"),
        device_fds=read_fds(environ),
        fabric=FabricSettings.from_environ(environ),
    )


def read_flag(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "0").strip()
    if raw not in ("0", "1"):
        raise EnvContractError(f"{name}={raw!r} is not 0 or 1", name, name)
    return raw == "1"


def read_target_options(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    raw = environ.get(TARGET_OPTIONS)
    if raw is None or not raw.strip():
        return ()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise EnvContractError(f"{TARGET_OPTIONS}={raw!r} is not valid JSON: {exc}", "target_options",
                               TARGET_OPTIONS) from exc
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise EnvContractError(
            f"{TARGET_OPTIONS}={raw!r} must be a JSON object of string values, "
            'e.g. {"ipuLinkDomainSize":"64"}',
            "target_options", TARGET_OPTIONS,
        )
    return tuple(parsed.items())


