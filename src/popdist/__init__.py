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
from popdist.core import __all__ as __all__
