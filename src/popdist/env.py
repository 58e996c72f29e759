"""The environment contract between the launcher and each instance.

The variable names are spelled once, in ``popdist.env_names``, and
re-exported here; everything else imports the constants. Programs written for
Graphcore's PopRun read the ``POPDIST_*``, ``IPUOF_*`` and
``POPLAR_TARGET_OPTIONS`` names; PopTorch and Horovod read the Open MPI
names; ``torch.distributed`` reads ``RANK``/``MASTER_*``. Because there is no
MPI here, we set all of them, consistently, from one ``InstanceEnv``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from popdist.env_names import *  # noqa: F401,F403 - the names are part of this module's API
from popdist.env_names import (
    DEVICE_FDS,
    EXECUTABLE_CACHE_PATH,
    FABRIC_ADDR,
    FABRIC_TIMEOUT,
    FABRIC_TRANSPORT,
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
    OMPI_LOCAL_RANK,
    OMPI_LOCAL_SIZE,
    OMPI_NODE_RANK,
    OMPI_RANK,
    OMPI_SIZE,
    RENDEZVOUS_ADDR,
    RENDEZVOUS_PORT,
    REPLICA_INDEX_OFFSET,
    STARTUP_TIMEOUT,
    TARGET_OPTIONS,
    TORCH_LOCAL_RANK,
    TORCH_LOCAL_WORLD_SIZE,
    TORCH_RANK,
    TORCH_WORLD_SIZE,
    TOTAL_REPLICAS,
    UNIFORM_REPLICAS,
    VIPU_GCD_ID,
    VIPU_HOST,
    VIPU_PARTITION,
    VIPU_PORT,
    VIPU_TIMEOUT,
)
from simipu.hardware import device_id as _device_id
from simipu.hardware import parent_device_id as _parent_device_id

DEFAULT_VIPU_HOST = "localhost"
DEFAULT_VIPU_PORT = 8090
DEFAULT_VIPU_TIMEOUT = 10  # seconds, poprun's --vipu-server-timeout default

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_MAX_PORT = 65535


FABRIC_TRANSPORTS = ("auto", "tcp")
#: The longest timeout an instance can wait with: poll/epoll take milliseconds in a C int (2**31 ms, ~24.8 days).
MAX_TIMEOUT_SECONDS = 1_000_000.0


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
        return cls(environ.get(JOB_TOKEN, ""), transport, _read_seconds(environ, FABRIC_TIMEOUT, 10.0),
                   _read_seconds(environ, STARTUP_TIMEOUT, 60.0))


def _read_fds(environ: Mapping[str, str]) -> tuple[int, ...]:
    text = environ.get(DEVICE_FDS, "").strip()
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise EnvContractError(f"{DEVICE_FDS}={text!r} is not a comma-separated list of descriptors",
                               "device_fds", DEVICE_FDS) from None


def _read_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
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


class EnvContractError(ValueError):
    """A value that breaks the contract; names the field and, if parsed, the variable."""

    def __init__(self, message: str, field: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.variable = variable


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
    fabric_addr: str = "127.0.0.1"
    device_fds: tuple[int, ...] = ()
    fabric: FabricSettings = FabricSettings()

    def __post_init__(self) -> None:
        if isinstance(self.target_options, Mapping):
            object.__setattr__(self, "target_options", tuple(self.target_options.items()))
        else:
            object.__setattr__(self, "target_options", tuple(tuple(p) for p in self.target_options))
        _validate(self)

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
        out.update({
            VIPU_HOST: self.vipu_host,
            VIPU_PORT: str(self.vipu_port),
            VIPU_PARTITION: self.vipu_partition,
            VIPU_TIMEOUT: str(self.vipu_timeout),
            VIPU_GCD_ID: str(self.gcd_id),
            TARGET_OPTIONS: json.dumps(self.target_options_dict, separators=(",", ":")),
            OMPI_RANK: str(self.instance_index),
            OMPI_SIZE: str(self.num_instances),
            OMPI_LOCAL_RANK: str(self.local_instance_index),
            OMPI_LOCAL_SIZE: str(self.num_local_instances),
            OMPI_NODE_RANK: str(self.local_instance_index),
            TORCH_RANK: str(self.instance_index),
            TORCH_WORLD_SIZE: str(self.num_instances),
            TORCH_LOCAL_RANK: str(self.local_instance_index),
            TORCH_LOCAL_WORLD_SIZE: str(self.num_local_instances),
        })
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
        _check_uniform_replicas(environ)
        values = _read_fields(environ)
        try:
            return cls(**values)
        except EnvContractError as exc:
            variable = _FIELD_VARIABLES.get(exc.field)
            if variable is None:  # derived from several variables
                raise
            shown = environ.get(variable)
            raise EnvContractError(
                f"{variable}={shown!r} is inconsistent with the rest of the "
                f"PopDist environment: {exc}",
                exc.field, variable,
            ) from exc


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


_FIELD_VARIABLES = {
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
}


def _check_uniform_replicas(environ: Mapping[str, str]) -> None:
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


def _read_fields(environ: Mapping[str, str]) -> dict[str, Any]:
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
        target_options=_read_target_options(environ),
        executable_cache_path=environ.get(EXECUTABLE_CACHE_PATH) or None,
        master_addr=environ.get(MASTER_ADDR, "127.0.0.1"),
        master_port=read_int(environ, MASTER_PORT, 0),
        rendezvous_addr=environ.get(RENDEZVOUS_ADDR, "127.0.0.1"),
        rendezvous_port=read_int(environ, RENDEZVOUS_PORT, 0),
        job_id=environ.get(JOB_ID, ""),
        offline=_read_flag(environ, OFFLINE),
        host_label=environ.get(HOST_LABEL, ""),
        fabric_addr=environ.get(FABRIC_ADDR, "127.0.0.1"),
        device_fds=_read_fds(environ),
        fabric=FabricSettings.from_environ(environ),
    )


def _read_flag(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "0").strip()
    if raw not in ("0", "1"):
        raise EnvContractError(f"{name}={raw!r} is not 0 or 1", name, name)
    return raw == "1"


def _read_target_options(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
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


def _fail(field: str, message: str) -> None:
    raise EnvContractError(f"InstanceEnv.{field} {message}", field)


def _validate(env: InstanceEnv) -> None:
    """Check types and the arithmetic the derived values rely on (no I/O)."""
    for f in fields(env):
        value = getattr(env, f.name)
        if f.name == "device_fds":
            if not all(isinstance(fd, int) and fd >= 0 for fd in value):
                _fail(f.name, f"must be descriptors (integers >= 0), got {value!r}")
        elif f.name == "fabric":
            if not isinstance(value, FabricSettings):
                _fail(f.name, f"must be FabricSettings, got {type(value).__name__}")
        elif f.name == "offline":
            if not isinstance(value, bool):
                _fail(f.name, f"must be a bool, got {value!r}")
        elif f.name == "target_options":
            if not all(len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str) for p in value):
                _fail(f.name, f"must be pairs of strings, got {value!r}")
        elif f.name == "executable_cache_path":
            if value is not None and (not isinstance(value, str) or not value or "\0" in value):
                _fail(f.name, f"must be None or a non-empty path, got {value!r}")
        elif f.type in ("int", int):
            if not isinstance(value, int) or isinstance(value, bool):
                _fail(f.name, f"must be an integer, got {value!r}")
            if value < 0:
                _fail(f.name, f"must be >= 0, got {value}")
        elif not isinstance(value, str) or "\0" in value:
            _fail(f.name, f"must be a string without NUL characters, got {value!r}")
    for name in ("num_total_replicas", "num_ipus_per_replica", "num_local_replicas", "num_local_instances"):
        if getattr(env, name) < 1:
            _fail(name, f"must be >= 1, got {getattr(env, name)}")
    total, local = env.num_total_replicas, env.num_local_replicas
    if total % local:
        _fail("num_local_replicas", f"({local}) must divide num_total_replicas ({total})")
    if env.replica_index_offset >= total or env.replica_index_offset % local:
        _fail("replica_index_offset", f"({env.replica_index_offset}) must be a multiple of "
              f"num_local_replicas ({local}) below num_total_replicas ({total})")
    if env.num_local_instances > total // local:
        _fail("num_local_instances", f"({env.num_local_instances}) exceeds the number of "
              f"instances ({total // local})")
    if env.local_instance_index >= env.num_local_instances:
        _fail("local_instance_index", f"({env.local_instance_index}) must be below "
              f"num_local_instances ({env.num_local_instances})")
    if not 1 <= env.vipu_port <= _MAX_PORT:
        _fail("vipu_port", f"must be in 1..{_MAX_PORT}, got {env.vipu_port}")
    for name in ("master_port", "rendezvous_port"):
        if getattr(env, name) > _MAX_PORT:
            _fail(name, f"must be in 0..{_MAX_PORT} (0: not chosen), got {getattr(env, name)}")
