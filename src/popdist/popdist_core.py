"""The guide's module path ``popdist.popdist_core``: the same functions as popdist.core."""

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
