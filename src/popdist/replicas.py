"""``popdist.replicas.run(fn)``: this instance's replicas, one thread each, with cross-replica ops."""

from __future__ import annotations

from typing import Any, Callable

from popdist import core
from popdist.backend import current_fabric


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``fn(replica, *args, **kwargs)`` for each local replica; results in local replica order.

    ``replica.index`` is the global replica index (the instance's offset plus
    the local index); ``replica.cross_replica_sum(x)`` and friends span every
    replica of every instance.
    """
    from simipu.replicas import ReplicaLayout, run_replicas

    layout = ReplicaLayout(core.getNumTotalReplicas(), core.getNumLocalReplicas(), core.getReplicaIndexOffset())
    return run_replicas(fn, current_fabric(), layout, *args, **kwargs)
