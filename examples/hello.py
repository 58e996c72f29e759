#!/usr/bin/env python3
"""The smallest PopDist program: each instance says where it is.

    poprun --num-instances 2 --num-replicas 4 python3 examples/hello.py
"""

import popdist

print(f"Hello world from instance {popdist.getInstanceIndex()} of {popdist.getNumInstances()}, "
      f"holding replicas {popdist.getReplicaIndexOffset()}-"
      f"{popdist.getReplicaIndexOffset() + popdist.getNumLocalReplicas() - 1} "
      f"of {popdist.getNumTotalReplicas()}", flush=True)
