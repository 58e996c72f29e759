"""PopDist: what an instance launched by poprun knows about its job.

``import popdist; popdist.getInstanceIndex()`` as with Graphcore's PopDist.
Kept light: no numpy or framework imports at package import time.
"""

from popdist.collectives import execute_on_instances, synchronize
from popdist.core import __all__ as _core_all
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

__all__ = [*_core_all, "LaunchConflict", "Options", "execute_on_instances", "synchronize"]
