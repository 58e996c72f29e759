"""Print this instance's environment and PopDist view as one JSON line."""

import json
import os

import popdist

print(json.dumps({
    "env": dict(os.environ),
    "api": {
        "instance": popdist.getInstanceIndex(),
        "instances": popdist.getNumInstances(),
        "local_instance": popdist.getLocalInstanceIndex(),
        "total_replicas": popdist.getNumTotalReplicas(),
        "local_replicas": popdist.getNumLocalReplicas(),
        "offset": popdist.getReplicaIndexOffset(),
        "ipus_per_replica": popdist.getNumIpusPerReplica(),
        "device_id": popdist.getDeviceId(),
        "set": popdist.isPopdistEnvSet(),
    },
}), flush=True)
