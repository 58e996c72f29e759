"""Checking an ``InstanceEnv`` as a whole: the types, and the arithmetic its derived values rely on.

Runs for every record, built by poprun's plan or read back in an instance,
so a value that passes here renders and parses back to itself.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from popdist.env_values import EnvContractError, FabricSettings

if TYPE_CHECKING:
    from popdist.env import InstanceEnv

_MAX_PORT = 65535


def _fail(field: str, message: str) -> None:
    raise EnvContractError(f"InstanceEnv.{field} {message}", field)


def check_instance_env(env: InstanceEnv) -> None:
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
    for name in ("num_total_replicas", "num_ipus_per_replica", "num_local_replicas", "num_local_instances",
                 "num_hosts"):
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
    if not env.host_index < env.num_hosts <= total // local:
        _fail("host_index", f"({env.host_index}) must be below num_hosts ({env.num_hosts}), which is at most "
              f"the number of instances ({total // local})")
    if not 1 <= env.vipu_port <= _MAX_PORT:
        _fail("vipu_port", f"must be in 1..{_MAX_PORT}, got {env.vipu_port}")
    for name in ("master_port", "rendezvous_port"):
        if getattr(env, name) > _MAX_PORT:
            _fail(name, f"must be in 0..{_MAX_PORT} (0: not chosen), got {getattr(env, name)}")
