"""``popdist.popart`` (user guide 4.2.2): PopART session options and device from the launch.

``configureSessionOptions(opts)`` turns on distributed replicated graphs with
this instance's share of the replicas, on a ``popart.SessionOptions`` or any
object with the same attributes (PopXL calls it for
``Ir(replication="popdist")``). ``getDevice()`` returns the device this
instance uses: PopART's attached ``DeviceInfo`` when PopART is installed,
otherwise the simulated device poprun attached for the instance, with the
names of PopART's (``id``, ``numIpus``, ``isAttached``, ``detach()``).
"""

from __future__ import annotations

import os
from typing import Any

from popdist.backend import held_device
from popdist.core import getDeviceId, getNumLocalReplicas, getNumTotalReplicas, getReplicaIndexOffset
from popdist.env import InstanceEnv

__all__ = ["DeviceInfo", "configureSessionOptions", "getDevice"]


def configureSessionOptions(opts: Any) -> None:
    """Set the replicated-graph options of ``opts`` from the launch (outside poprun: 1 replica of 1)."""
    local, total = getNumLocalReplicas(), getNumTotalReplicas()
    opts.enableReplicatedGraphs = total > 1
    opts.replicatedGraphCount = local
    opts.enableDistributedReplicatedGraphs = total > local
    opts.globalReplicaOffset = getReplicaIndexOffset()
    opts.globalReplicationFactor = total


class DeviceInfo:
    """PopART's names over a simulated device: the IPUs poprun attached for this instance, if any.

    Offline and outside poprun nothing is held: the device has its Poplar id
    and IPU count (enough to compile for) and ``isAttached`` is False.
    """

    def __init__(self, device_id: int, num_ipus: int, held: Any = None) -> None:
        self.id = device_id
        self.numIpus = num_ipus
        self._held = held

    @property
    def isAttached(self) -> bool:
        return self._held is not None and bool(self._held.attached)

    @property
    def ipus(self) -> tuple[int, ...]:
        """The cluster IPUs held (empty when nothing is attached)."""
        return tuple(self._held.ipus) if self._held is not None else ()

    def detach(self) -> None:
        """Release the IPUs for other processes (idempotent)."""
        if self._held is not None:
            self._held.detach()

    def attach(self) -> bool:
        """Take the IPUs again after ``detach()``, as PopART's ``DeviceInfo.attach``: True if attached (False
        with nothing to attach: offline, or outside poprun); raises if another process has taken them."""
        if self._held is not None:
            self._held.attach()
        return self.isAttached

    def __repr__(self) -> str:
        state = "attached" if self.isAttached else "not attached"
        return f"<popdist.popart.DeviceInfo id={self.id} numIpus={self.numIpus} {state}>"


def getDevice(ipusPerReplica: int | None = None, connectionType: Any = None) -> Any:
    """The device for this instance: ``getDeviceId(ipusPerReplica)``, attached.

    ``ipusPerReplica`` may be omitted (the launch's value); ``connectionType``
    is passed to PopART when it is installed and otherwise has nothing to change.
    """
    device_id = getDeviceId(ipusPerReplica)
    try:
        import popart
    except ImportError:
        return _simulated_device(device_id, ipusPerReplica)
    manager = popart.DeviceManager()
    device = (manager.acquireDeviceById(device_id) if connectionType is None
              else manager.acquireDeviceById(device_id, connectionType=connectionType))
    if device is None:
        raise RuntimeError(f"PopART could not attach to device {device_id}: another process holds its IPUs")
    return device


def _simulated_device(device_id: int, ipus_per_replica: int | None) -> DeviceInfo:
    launch = InstanceEnv.from_environ(os.environ)
    if launch is None:
        return DeviceInfo(device_id, ipus_per_replica or 1)
    device = DeviceInfo(device_id, launch.num_local_replicas * launch.num_ipus_per_replica, held_device(launch))
    device.attach()  # (the guide's "an attached device", also after the program detached an earlier one)
    return device
