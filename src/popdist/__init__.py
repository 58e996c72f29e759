"""PopDist: what an instance launched by poprun knows about its job.

``import popdist; popdist.getInstanceIndex()`` as with Graphcore's PopDist.
Kept light: no numpy or framework imports at package import time.
"""

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
from popdist.collectives import execute_on_instances, synchronize
from popdist.core import __all__ as _core_all

__all__ = [*_core_all, "execute_on_instances", "synchronize"]
