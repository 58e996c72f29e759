"""Getting IPUs for a launch from the V-IPU service, with the guide's partition semantics.

``--vipu-partition NAME``: create it if it does not exist; use it if it fits;
if it does not fit, update it with ``--update-partition=yes``, else stop with
a line saying so. Reset per ``--reset-partition`` (default: reset a
non-reconfigurable partition, not a reconfigurable one), and verify the final
state after a create or reset. Without a name: use the only partition that
fits, else create a temporary one. A partition poprun created is removed when
the job ends unless ``--remove-partition=no``.

Creation is one atomic allocation in the service, so two launches can never
be given the same IPUs (the race in the guide's "Known issues").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from popdist.env import DEFAULT_VIPU_PORT
from simipu.devices import Device, DeviceBusy, attach
from simipu.hardware import device_id
from simipu.vipu import (
    NotEnoughIpus,
    Partition,
    PartitionNotFound,
    PartitionRequest,
    PartitionTooLarge,
    VipuApi,
    VipuError,
    VipuUnreachable,
    open_vipu,
)

from .errors import (
    DevicesUnavailable,
    PartitionFailed,
    PartitionMismatch,
    PartitionTooBig,
    VipuServiceError,
    VipuServerUnreachable,
)
from .plan import Allocation
from .spec import LaunchSpec

log = logging.getLogger("poprun.vipu")


@dataclass(frozen=True)
class PartitionLease:
    """The partition a job runs on, and whether poprun must remove it at the end."""

    allocation: Allocation
    partition: Partition
    remove_at_end: bool
    api: VipuApi | None = None


def partition_request(spec: LaunchSpec, name: str) -> PartitionRequest:
    """What this launch needs: one GCD per instance, the ILDs and link settings asked for."""
    return PartitionRequest(
        name=name,
        size=spec.num_ipus,
        cluster=spec.vipu.cluster or spec.vipu.allocation,
        num_ilds=spec.num_ilds,
        num_gcds=spec.num_instances,
        ipu_link_routing_type=spec.vipu.ipu_link_routing_type,
        gw_link_routing_type=spec.vipu.gw_link_routing_type,
        sync_type=spec.vipu.sync_type,
    )


def acquire_partition(spec: LaunchSpec, job_id: str) -> PartitionLease:
    """Find, create, update or reset the partition this launch runs on; errors say what to do."""
    try:
        api = open_vipu(
            host=spec.vipu.server_host,
            port=spec.vipu.server_port,
            timeout=float(spec.vipu.server_timeout),
            cluster_name=spec.vipu.cluster or spec.vipu.allocation,
        )
        partition, created = _find_or_create(api, spec, job_id)
        partition = _reset_if_asked(api, spec, partition, created)
    except VipuUnreachable as exc:
        raise VipuServerUnreachable(f"{exc}; start one with 'simipu vipu-server', or leave out --vipu-server-host "
                                    "to use the embedded service") from None
    except PartitionTooLarge as exc:
        raise PartitionTooBig(str(exc)) from None
    except NotEnoughIpus as exc:
        raise DevicesUnavailable(f"{exc}; free some with 'simipu vipu remove partition NAME'") from None
    except VipuError as exc:
        raise VipuServiceError(str(exc)) from None
    if not partition.is_active:
        raise PartitionFailed(
            f"partition {partition.name} is in state {partition.state}; reset it with --reset-partition=yes "
            f"(or 'simipu vipu reset partition {partition.name}')"
        )
    log.debug("Done polling, final state of %s: %s", partition.name, partition.state)
    allocation = Allocation(
        partition=partition.name,
        node_device_id=partition.parent_device_id,
        server_host=spec.vipu.server_host or "localhost",
        server_port=spec.vipu.server_port or DEFAULT_VIPU_PORT,
        server_timeout=spec.vipu.server_timeout,
        gateway_mode=True,
        offline=False,
    )
    return PartitionLease(allocation, partition, created and spec.vipu.remove_partition, api)


def _find_or_create(api: VipuApi, spec: LaunchSpec, job_id: str) -> tuple[Partition, bool]:
    name = spec.vipu.partition
    if name is None:
        request = partition_request(spec, f"poprun-{job_id[:8]}")
        fitting = [p for p in api.list_partitions() if p.is_active and not p.differences(request)]
        if len(fitting) == 1:
            log.info("Using V-IPU partition %s as it is the only one available", fitting[0].name)
            return fitting[0], False
        return _create(api, spec, request), True
    request = partition_request(spec, name)
    try:
        partition = api.get_partition(name)
    except PartitionNotFound:
        return _create(api, spec, request), True
    log.info("Partition %s already exists and is in state: %s", name, partition.state)
    differences = partition.differences(request)
    if differences:
        if not spec.vipu.update_partition:
            raise PartitionMismatch(
                f"partition {name} does not fit this launch ({_describe(partition, request, differences)}); "
                "add --update-partition=yes to update it, or choose another --vipu-partition"
            )
        log.info("Updating partition %s (%s)", name, ", ".join(differences))
        partition = api.update_partition(name, request)
    return partition, False


def _create(api: VipuApi, spec: LaunchSpec, request: PartitionRequest) -> Partition:
    attempts = spec.vipu.partition_attempts
    for attempt in range(1, attempts + 1):
        try:
            partition = api.create_partition(request)
            log.info("Created partition %s with %d IPUs (parent device %d)", partition.name, partition.size,
                     partition.parent_device_id)
            return partition
        except NotEnoughIpus:
            if attempt == attempts:
                raise
            log.info("Not enough free IPUs for partition %s (attempt %d of %d)", request.name, attempt, attempts)
    raise AssertionError("unreachable")


def _reset_if_asked(api: VipuApi, spec: LaunchSpec, partition: Partition, created: bool) -> Partition:
    reset = spec.vipu.reset_partition
    if reset is None:  # the guide's default; a partition just created needs none
        reset = not created and not partition.reconfigurable
    if reset:
        log.info("Resetting partition %s", partition.name)
        partition = api.reset_partition(partition.name)
    return partition


def _describe(partition: Partition, request: PartitionRequest, differences: list[str]) -> str:
    return ", ".join(f"{key} is {getattr(partition, key)}, the launch needs {getattr(request, key)}" for key in differences)


def attach_devices(spec: LaunchSpec, lease: PartitionLease, job_id: str) -> dict[int, Device]:
    """Phase 1 and 2 at once: take every instance's device now, to hand over at spawn.

    The instances inherit the IPU locks (see ``simipu.devices.hand_over``), so
    no other process can take their IPUs between allocation and attachment.
    """
    partition = lease.partition
    ipus_per_instance = spec.replicas_per_instance * spec.ipus_per_replica
    log.info("Preparing parent device %d", partition.parent_device_id)
    devices: dict[int, Device] = {}
    try:
        for index in range(spec.num_instances):
            devices[index] = attach(partition, device_id(partition.size, ipus_per_instance, index), job=job_id)
    except DeviceBusy as exc:
        for device in devices.values():
            device.detach()
        raise DevicesUnavailable(f"{exc}; wait for it to finish, or use another partition") from None
    log.info("Found %d children (expected %d) of device %d with %d IPUs each", len(devices), spec.num_instances,
             partition.parent_device_id, ipus_per_instance)
    return devices


def release_partition(lease: PartitionLease) -> None:
    """Remove the partition poprun created, if asked; a failure here is a warning, not the job's result."""
    if not lease.remove_at_end or lease.api is None:
        return
    try:
        lease.api.remove_partition(lease.partition.name)
        log.info("Removed partition %s", lease.partition.name)
    except VipuError as exc:
        log.warning("could not remove partition %s: %s", lease.partition.name, exc)
