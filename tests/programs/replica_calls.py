"""Replicas of one instance that do not make the same cross-replica calls (``popdist.replicas.run``).

``python replica_calls.py MODE``: ``op`` (replica 0 of each instance takes the max, the others the sum),
``early`` (global replica 1 returns without the call the others make). Every replica prints its result.
"""

import sys

import numpy as np

import popdist
from popdist import replicas

MODE = sys.argv[1]


def program(replica):
    value = np.array([float(replica.index + 1)])
    if MODE == "op":
        call = replica.cross_replica_max if replica.local_index == 0 else replica.cross_replica_sum
        return call(value).tolist()
    if replica.index == 1:
        return None
    return replica.cross_replica_sum(value).tolist()


print(popdist.getInstanceIndex(), replicas.run(program), flush=True)
