"""PopDist's core API (user guide section 4.2.1), in the guide's camelCase.

Every function reads ``os.environ`` when called, not at import, so a
program (or a test) that changes its environment sees the change. Outside
poprun each function returns the default the guide documents.
"""

from __future__ import annotations

import logging
import os

from popdist.backend import _backend, initialise
from popdist.env import InstanceEnv, is_uniform_replicas
from popdist.env_names import TOTAL_REPLICAS
from simipu.hardware import parent_device_id

__all__ = [
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
]

logger = logging.getLogger(__name__)


def _launch() -> InstanceEnv | None:
    """The launch this process belongs to, or None outside poprun."""
    return InstanceEnv.from_environ(os.environ)


def isPopdistEnvSet() -> bool:
    """True when this process was launched by poprun: the PopDist environment is there (a yes or no, as
    Graphcore's; the getters say what is wrong with a malformed one, or with replicas not uniform)."""
    return TOTAL_REPLICAS in os.environ


def isUniformReplicasPerInstance() -> bool:
    """True when every instance holds as many replicas, or outside poprun."""
    return is_uniform_replicas(os.environ)


def getNumTotalReplicas() -> int:
    """Replicas across all instances; 1 outside poprun."""
    launch = _launch()
    return 1 if launch is None else launch.num_total_replicas


def getNumIpusPerReplica() -> int:
    """IPUs per replica; 1 outside poprun."""
    launch = _launch()
    return 1 if launch is None else launch.num_ipus_per_replica


def getNumLocalReplicas() -> int:
    """Replicas held by this instance; 1 outside poprun."""
    launch = _launch()
    return 1 if launch is None else launch.num_local_replicas


def getReplicaIndexOffset() -> int:
    """Index of this instance's first replica; 0 outside poprun."""
    launch = _launch()
    return 0 if launch is None else launch.replica_index_offset


def getInstanceIndex() -> int:
    """This instance's index in [0, getNumInstances()); 0 outside poprun."""
    launch = _launch()
    return 0 if launch is None else launch.instance_index


def getNumInstances() -> int:
    """Instances in the job; 1 outside poprun."""
    launch = _launch()
    return 1 if launch is None else launch.num_instances


def getLocalInstanceIndex() -> int:
    """This instance's index among the instances on its host; 0 outside poprun."""
    launch = _launch()
    return 0 if launch is None else launch.local_instance_index


def checkNumIpusPerReplica(expected: int) -> bool:
    """True when the launch's IPUs per replica (1 outside poprun) equals expected."""
    return getNumIpusPerReplica() == expected


def getDeviceId(ipus_per_replica: int | None = None, *, ipusPerReplica: int | None = None) -> int:
    """The Poplar device id this instance should attach to.

    Under poprun: the group of local replicas x IPUs per replica IPUs that
    this instance owns in the partition. Outside poprun: the device of one
    replica of ipus_per_replica IPUs. 0 or None means "the launch's value"
    (1 outside poprun). Both spellings of the argument are accepted because
    programs written for Graphcore's PopDist call ``getDeviceId(ipusPerReplica=0)``.
    """
    if ipus_per_replica is not None and ipusPerReplica is not None:
        raise TypeError("getDeviceId() takes ipus_per_replica or ipusPerReplica, not both")
    requested = ipusPerReplica if ipus_per_replica is None else ipus_per_replica
    if requested is not None and (
        not isinstance(requested, int) or isinstance(requested, bool) or requested < 0
    ):
        raise ValueError(f"getDeviceId(): ipus_per_replica must be an integer >= 0, got {requested!r}")
    launch = _launch()
    if launch is None:
        return parent_device_id(requested or 1)
    if requested and requested != launch.num_ipus_per_replica:
        raise ValueError(
            f"getDeviceId(ipus_per_replica={requested}) disagrees with the launch, "
            f"which has {launch.num_ipus_per_replica} IPUs per replica "
            f"(poprun --ipus-per-replica {launch.num_ipus_per_replica}); pass "
            f"{launch.num_ipus_per_replica}, 0 or None, or relaunch with "
            f"--ipus-per-replica {requested}"
        )
    return launch.device_id


def init() -> None:
    """Initialise PopDist for this process; harmless outside poprun.

    The environment is parsed first, so a broken launch fails here with a
    message naming the variable rather than later in a collective.
    """
    initialise()


def isBackendInitialized() -> bool:
    """True between init() and finalizeBackend()."""
    with _backend.lock:
        return _backend.initialised


def finalizeBackend() -> None:
    """Undo init(); a no-op when not initialised."""
    with _backend.lock:
        if _backend.initialised:
            logger.debug("popdist finalised")
        fabric, _backend.fabric = _backend.fabric, None
        _backend.hot_allreduces, _backend.hot_copies = {}, {}
        _backend.initialised = False
    if fabric is not None:
        fabric.close(why="finalized")
