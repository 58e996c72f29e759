"""Getting IPUs for a launch from the V-IPU service, with the guide's partition semantics.

``--vipu-partition NAME``: create it if it does not exist; use it if it fits;
if it does not fit, update it with ``--update-partition=yes``, else stop with
a line saying so. Reset per ``--reset-partition`` (default: reset a
non-reconfigurable partition, not a reconfigurable one), and verify the final
state after a create or reset. Without a name: use the only partition that
fits and no one uses, else create a temporary one. A partition poprun
created is removed when the job ends unless ``--remove-partition=no``.

Creation is one atomic allocation in the service, so two launches can never
be given the same IPUs (the race in the guide's "Known issues"). poprun
holds the partition in the service for the whole job (a lease that dies with
it), before any reset or update: a partition another live launch holds is
never adopted, reset or updated, and a temporary partition whose poprun was
killed is reclaimed, not reused.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from simipu.devices import Device, DeviceBusy, DeviceDirUnusable, DeviceError, attach
from simipu.hardware import device_id
from simipu.vipu import (
    Lease,
    NotAVipuServer,
    NotEnoughIpus,
    Partition,
    PartitionExists,
    PartitionInUse,
    PartitionNotFound,
    PartitionRequest,
    PartitionTooLarge,
    StateDirUnusable,
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
    UsageError,
    VipuServerUnreachable,
    VipuServiceError,
)
from .plan import Allocation
from .records import Placement, VipuSettings

log = logging.getLogger("poprun.vipu")


@dataclass(frozen=True)
class PartitionLease:
    """The partition a job runs on, and whether poprun must remove it at the end."""

    allocation: Allocation
    partition: Partition
    remove_at_end: bool
    api: VipuApi | None = None
    holder: Lease | None = None


def partition_request(placement: Placement, vipu: VipuSettings, name: str) -> PartitionRequest:
    """What this launch needs: one GCD per instance, the ILDs and link settings asked for."""
    return PartitionRequest(
        name=name,
        size=placement.num_ipus,
        cluster=vipu.cluster or vipu.allocation,
        num_ilds=placement.num_ilds,
        num_gcds=placement.num_instances,
        ipu_link_routing_type=vipu.ipu_link_routing_type,
        gw_link_routing_type=vipu.gw_link_routing_type,
        sync_type=vipu.sync_type,
    )


def acquire_partition(placement: Placement, vipu: VipuSettings, job_id: str) -> PartitionLease:
    """Find, create, update or reset the partition this launch runs on; errors say what to do."""
    holder = Lease.of_this_process(job_id)
    with vipu_errors():
        api = open_vipu(
            host=vipu.server_host,
            port=vipu.server_port,
            timeout=float(vipu.server_timeout),
            cluster_name=vipu.cluster or vipu.allocation,
        )
        _reclaim_dead_launches_of_this_host(api)
        partition, created = _find_or_create(api, placement, vipu, holder)
        try:
            partition = _reset_if_asked(api, vipu, partition, created, holder)
        except BaseException:
            _let_go(api, partition, holder, created and vipu.remove_partition)
            raise
    if not partition.is_active:
        _let_go(api, partition, holder, created and vipu.remove_partition)
        raise PartitionFailed(
            f"partition {partition.name} is in state {partition.state}; reset it with --reset-partition=yes "
            f"(or 'simipu vipu reset partition {partition.name}')"
        )
    log.debug("Done polling, final state of %s: %s", partition.name, partition.state)
    allocation = Allocation(
        partition=partition.name,
        node_device_id=partition.parent_device_id,
        server_host=vipu.server_host or "",  # the embedded service: no server for instances to reach
        server_port=vipu.server_port,
        server_timeout=vipu.server_timeout,
        gateway_mode=True,
        offline=False,
    )
    return PartitionLease(allocation, partition, created and vipu.remove_partition, api, holder)


@contextmanager
def vipu_errors() -> Iterator[None]:
    """The V-IPU service's refusals as poprun's errors, one line and exit code each, for launch and --dry-run alike."""
    try:
        yield
    except PermissionError as exc:  # the token file is not safe to use
        raise VipuServiceError(str(exc)) from None
    except PartitionInUse as exc:
        raise DevicesUnavailable(str(exc)) from None
    except NotAVipuServer as exc:
        raise VipuServerUnreachable(str(exc)) from None  # (it says to check the host and port)
    except VipuUnreachable as exc:
        raise VipuServerUnreachable(f"{exc}; start one with 'simipu vipu-server', or leave out --vipu-server-host "
                                    "to use the embedded service") from None
    except PartitionTooLarge as exc:
        raise PartitionTooBig(str(exc)) from None
    except NotEnoughIpus as exc:
        raise DevicesUnavailable(str(exc)) from None  # (it says what to do)
    except StateDirUnusable as exc:  # XDG_STATE_HOME or HOME names a file, say: this machine's setting, not the service
        raise UsageError(str(exc)) from None
    except VipuError as exc:
        raise VipuServiceError(str(exc)) from None


def _reclaim_dead_launches_of_this_host(api: VipuApi) -> None:
    """Tell the service which of this host's holders are gone (a server elsewhere cannot check them)."""
    seen: set[Lease] = set()
    for partition in api.list_partitions():
        for lease in (partition.lease, *partition.holders):
            if lease is not None and lease not in seen and lease.alive() is False:
                seen.add(lease)
                removed = api.reclaim(lease)
                log.info("Reclaimed what %s held (removed %s)", lease.describe(), ", ".join(removed) or "no partition")


def _find_or_create(api: VipuApi, placement: Placement, vipu: VipuSettings,
                    holder: Lease) -> tuple[Partition, bool]:
    """The partition, held by this launch from here on, and whether poprun created it."""
    name = vipu.partition
    assert holder.job is not None
    if name is None:
        request = partition_request(placement, vipu, f"poprun-{holder.job[:8]}")
        fitting = [p for p in api.list_partitions() if p.is_active and not p.differences(request)]
        free = [p for p in fitting if not p.in_use]
        if len(free) == 1:
            try:
                partition = api.claim_partition(free[0].name, holder)
                log.info("Using V-IPU partition %s as it is the only one available", partition.name)
                return partition, False
            except PartitionInUse:  # another launch took it a moment ago: make our own
                pass
        return _create(api, vipu, request, holder, temporary=True), True
    request = partition_request(placement, vipu, name)
    try:
        partition = api.get_partition(name)
    except PartitionNotFound:
        try:
            return _create(api, vipu, request, holder, temporary=vipu.remove_partition), True
        except PartitionExists:  # created by a concurrent launch of the same name: use it as any existing one
            pass
    partition = api.claim_partition(name, holder)  # before any change: refused if another launch holds it
    log.info("Partition %s already exists and is in state: %s", name, partition.state)
    try:
        return _fit(api, vipu, partition, request, holder), False
    except BaseException:
        _let_go(api, partition, holder, False)
        raise


def _fit(api: VipuApi, vipu: VipuSettings, partition: Partition, request: PartitionRequest,
         holder: Lease) -> Partition:
    """The existing partition as the launch needs it: updated if it differs and --update-partition=yes."""
    differences = partition.differences(request)
    if not differences:
        return partition
    if not vipu.update_partition:
        raise PartitionMismatch(
            f"partition {partition.name} does not fit this launch ({_describe(partition, request, differences)}); "
            "add --update-partition=yes to update it, or choose another --vipu-partition"
        )
    log.info("Updating partition %s (%s)", partition.name, ", ".join(differences))
    return api.update_partition(partition.name, request, holder)


def _create(api: VipuApi, vipu: VipuSettings, request: PartitionRequest, holder: Lease, temporary: bool) -> Partition:
    attempts = vipu.partition_attempts
    for attempt in range(1, attempts + 1):
        try:
            partition = api.create_partition(request, holder, temporary)
            log.info("Created partition %s with %d IPUs (parent device %d)", partition.name, partition.size,
                     partition.parent_device_id)
            return partition
        except NotEnoughIpus:
            if attempt == attempts:
                raise
            log.info("Not enough free IPUs for partition %s (attempt %d of %d)", request.name, attempt, attempts)
    raise AssertionError("unreachable")


def _reset_if_asked(api: VipuApi, vipu: VipuSettings, partition: Partition, created: bool,
                    holder: Lease) -> Partition:
    reset = vipu.reset_partition
    if reset is None:  # the guide's default; a partition just created needs none
        reset = not created and not partition.reconfigurable
    if reset:
        log.info("Resetting partition %s", partition.name)
        partition = api.reset_partition(partition.name, holder)
    return partition


def _let_go(api: VipuApi, partition: Partition, holder: Lease, remove: bool) -> None:
    """Give back what this launch holds (and the partition it made, if asked); a failure is only a warning."""
    try:
        if remove:
            api.remove_partition(partition.name, holder)
            log.info("Removed partition %s", partition.name)
        else:
            api.release_partition(partition.name, holder)
    except VipuError as exc:
        log.warning("could not %s partition %s: %s (it is reclaimed once poprun has exited)",
                    "remove" if remove else "release", partition.name, exc)


def _describe(partition: Partition, request: PartitionRequest, differences: list[str]) -> str:
    return ", ".join(f"{key} is {getattr(partition, key)}, the launch needs {getattr(request, key)}" for key in differences)


def attach_devices(placement: Placement, lease: PartitionLease, job_id: str) -> dict[int, Device]:
    """Phase 1 and 2 at once: take every instance's device now, to hand over at spawn.

    The instances inherit the IPU locks (see ``simipu.devices.hand_over``), so
    no other process can take their IPUs between allocation and attachment.
    """
    partition = lease.partition
    ipus_per_instance = placement.ipus_per_instance
    log.info("Preparing parent device %d", partition.parent_device_id)
    devices: dict[int, Device] = {}
    try:
        for index in range(placement.num_instances):
            devices[index] = attach(partition, device_id(partition.size, ipus_per_instance, index), job=job_id)
    except DeviceError as exc:
        for device in devices.values():
            device.detach()
        if isinstance(exc, DeviceBusy):
            raise DevicesUnavailable(f"{exc}; wait for it to finish, or use another partition") from None
        if isinstance(exc, DeviceDirUnusable):  # XDG_STATE_HOME names a file, say: this machine's setting
            raise UsageError(str(exc)) from None
        raise VipuServiceError(str(exc)) from None  # an unsafe device directory, say
    log.info("Found %d children (expected %d) of device %d with %d IPUs each", len(devices), placement.num_instances,
             partition.parent_device_id, ipus_per_instance)
    return devices


def release_partition(lease: PartitionLease) -> None:
    """Let go of the partition, removing it if poprun created it; a failure here is a warning, not the job's result."""
    if lease.api is None or lease.holder is None:
        return
    _let_go(lease.api, lease.partition, lease.holder, lease.remove_at_end)
