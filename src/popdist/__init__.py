"""PopDist: what an instance launched by poprun knows about its job.

``import popdist; popdist.getInstanceIndex()`` as with Graphcore's PopDist.
Kept light: no numpy or framework imports at package import time, and the
public names load on first use (PEP 562), so the launcher, which imports only
``popdist.env``, does not load the backend, the collectives and ``Options``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from popdist.collectives import execute_on_instances, synchronize
    from popdist.core import (
        checkNumIpusPerReplica,
        finalizeBackend,
        getDeviceId,
        getInstanceIndex,
        getLocalInstanceIndex,
        getNumInstances,
        getNumIpusPerReplica,
        getNumLocalReplicas,
        getNumTotalReplicas,
        getReplicaIndexOffset,
        init,
        isBackendInitialized,
        isPopdistEnvSet,
        isUniformReplicasPerInstance,
    )
    from popdist.options import LaunchConflict, Options

_CORE = (
    "checkNumIpusPerReplica",
    "finalizeBackend",
    "getDeviceId",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "init",
    "isBackendInitialized",
    "isPopdistEnvSet",
    "isUniformReplicasPerInstance",
)
#: Public name -> the module that defines it.
_HOMES = {
    **dict.fromkeys(_CORE, "popdist.core"),
    "LaunchConflict": "popdist.options",
    "Options": "popdist.options",
    "execute_on_instances": "popdist.collectives",
    "synchronize": "popdist.collectives",
}

__all__ = [*_CORE, "LaunchConflict", "Options", "execute_on_instances", "synchronize"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'popdist' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # later uses find it without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
