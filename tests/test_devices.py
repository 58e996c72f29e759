"""The hardware model, device ids -> IPUs, and exclusive attaching across processes."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from simipu import hardware
from simipu.devices import (
    DeviceBusy,
    NoSuchDevice,
    PartitionNotActive,
    attach,
    attach_ipus,
    device_info,
    ipu_holder,
    listing_lines,
    partition_devices,
)
from simipu.vipu import Lease, Partition, PartitionRequest, VipuService
from simipu.vipu.testing import start_holder, stop_process

# -- hardware ---------------------------------------------------------------

def test_pod_figures() -> None:
    assert hardware.IPUS_PER_POD16 == 4 * hardware.IPUS_PER_M2000
    assert hardware.IPUS_PER_POD64 == 16 * hardware.IPUS_PER_M2000 == hardware.IPUS_PER_ILD
    assert [hardware.parse_cluster_size(s) for s in ("pod16", "POD64", "pod128", "pod256", "8", 192)] == [
        16, 64, 128, 256, 8, 192]
    assert [hardware.cluster_num_ilds(n) for n in (16, 64, 128, 256)] == [1, 1, 2, 4]
    assert hardware.ild_size(16) == 16 and hardware.ild_size(256) == 64
    assert hardware.m2000_of(0) == 0 and hardware.m2000_of(63) == 15


@pytest.mark.parametrize("spec", ["pod3", "6", 0, 96, "", "lots"])
def test_impossible_clusters_are_refused(spec: object) -> None:
    with pytest.raises(ValueError):
        hardware.parse_cluster_size(spec)  # type: ignore[arg-type]


def test_device_id_figures_from_reference() -> None:
    # 8 replicas x 2 IPUs in 4 instances: N=16, S=4 -> ids 24..27, each 4 IPUs in order.
    assert [hardware.device_id(16, 4, i) for i in range(4)] == [24, 25, 26, 27]
    assert [hardware.device_group(16, d) for d in (24, 25, 26, 27)] == [(4, 0), (4, 1), (4, 2), (4, 3)]
    assert list(hardware.device_ipus(16, 26)) == [8, 9, 10, 11]
    # A 64-IPU parent device is 126; a 4-IPU partition with one instance is 6.
    assert hardware.parent_device_id(64) == 126 and hardware.device_group(64, 126) == (64, 0)
    assert hardware.device_group(4, 6) == (4, 0) and list(hardware.device_ipus(4, 6)) == [0, 1, 2, 3]


@pytest.mark.parametrize("num_ipus", [1, 2, 4, 16, 64, 3, 12])
def test_device_ids_and_groups_are_inverse(num_ipus: int) -> None:
    ids = hardware.device_ids(num_ipus)
    assert len(ids) == len(set(ids)) and ids[-1] == hardware.parent_device_id(num_ipus)
    for device in ids:
        size, index = hardware.device_group(num_ipus, device)
        assert hardware.device_id(num_ipus, size, index) == device
    for bad in (-1, ids[-1] + 1, True):
        with pytest.raises(ValueError):
            hardware.device_group(num_ipus, bad)  # type: ignore[arg-type]


def test_gcd_split() -> None:
    assert hardware.gcd_ipus(16, 4) == [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]
    with pytest.raises(ValueError):
        hardware.gcd_ipus(16, 3)


# -- devices of a partition --------------------------------------------------

@pytest.fixture
def service(tmp_path: Path) -> VipuService:
    return VipuService(tmp_path / "vipu.sqlite")


@pytest.fixture
def p16(service: VipuService) -> Partition:
    service.create_partition(PartitionRequest("first", 4))
    return service.create_partition(PartitionRequest("p16", 16))  # cluster IPUs 16..31


def test_partition_devices_map_to_cluster_ipus(p16: Partition) -> None:
    devices = partition_devices(p16)
    assert [d.id for d in devices] == list(range(31))
    assert devices[0].ipus == (16,) and devices[16].ipus == (16, 17)
    assert device_info(p16, 25).ipus == (20, 21, 22, 23)
    parent = device_info(p16)
    assert parent.id == 30 and parent.ipus == tuple(range(16, 32))
    assert parent.tiles == 16 * 1472 and parent.memory_bytes == 16 * hardware.IPU_MEMORY_BYTES
    with pytest.raises(NoSuchDevice):
        device_info(p16, 31)


def test_attach_is_exclusive_within_a_process(p16: Partition, tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    with attach(p16, 24, device_dir=devices, job="job-a") as device:
        assert device.attached and device.ipus == (16, 17, 18, 19)
        # Overlapping devices (the parent, a 2-IPU group, one IPU) are refused ...
        for overlapping in (30, 16, 3):
            with pytest.raises(DeviceBusy) as busy:
                attach(p16, overlapping, device_dir=devices)
            assert busy.value.holder_pid is not None and busy.value.holder.job == "job-a"
        # ... disjoint ones are not, and a refusal leaves nothing half-held.
        with attach(p16, 25, device_dir=devices) as other:
            assert other.ipus == (20, 21, 22, 23)
        assert ipu_holder("cluster0", 20, devices) is None
        assert ipu_holder("cluster0", 16, devices).job == "job-a"  # type: ignore[union-attr]
    assert not device.attached
    assert ipu_holder("cluster0", 16, devices) is None
    attach(p16, device_dir=devices).detach()  # the whole partition is free again


def test_a_detached_device_attaches_again_unless_another_holds_it(p16: Partition, tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    device = attach(p16, 24, device_dir=devices, job="job-a")
    device.detach()
    other = attach(p16, 24, device_dir=devices, job="job-b")
    with pytest.raises(DeviceBusy) as busy:
        device.attach()
    assert busy.value.holder.job == "job-b" and not device.attached  # type: ignore[union-attr]
    other.detach()
    device.attach()
    assert device.attached and ipu_holder("cluster0", 16, devices).job == "job-a"  # type: ignore[union-attr]
    device.attach()  # (attached: nothing to do)
    device.detach()


def test_attach_ipus_directly(tmp_path: Path) -> None:
    with attach_ipus("cluster0", [5, 6], device_dir=tmp_path) as device:
        with pytest.raises(DeviceBusy):
            attach_ipus("cluster0", [6], device_dir=tmp_path)
        assert attach_ipus("other-cluster", [6], device_dir=tmp_path).attached
    for bad in ([], [1, 1], [-1]):
        with pytest.raises(NoSuchDevice):
            attach_ipus("cluster0", bad, device_dir=tmp_path)
    assert not device.attached


def test_failed_partition_cannot_be_attached(service: VipuService, p16: Partition, tmp_path: Path) -> None:
    failed = service.mark_failed("p16")
    with pytest.raises(PartitionNotActive, match="PS_FAILED"):
        attach(failed, device_dir=tmp_path)
    attach(service.reset_partition("p16"), device_dir=tmp_path).detach()


def test_another_process_holds_until_it_is_killed(service: VipuService, p16: Partition, tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    holder = start_holder(service.state_path, "p16", 24, device_dir=devices, job="job-b")
    try:
        with pytest.raises(DeviceBusy) as busy:
            attach(p16, 30, device_dir=devices)
        assert busy.value.holder_pid == holder.pid and f"pid {holder.pid}" in str(busy.value)
        assert "job-b" in str(busy.value)
        # A second process is refused the same way.
        with pytest.raises(RuntimeError, match=f"DeviceBusy: .*pid {holder.pid}"):
            start_holder(service.state_path, "p16", 16, device_dir=devices)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert holder.returncode == -signal.SIGKILL
        # The kernel dropped the locks with the process: no cleanup needed.
        attach(p16, 30, device_dir=devices).detach()
    finally:
        stop_process(holder)


def test_holder_that_exits_normally_releases(service: VipuService, p16: Partition, tmp_path: Path) -> None:
    holder = start_holder(service.state_path, "p16", device_dir=tmp_path)
    try:
        assert ipu_holder("cluster0", 31, tmp_path).pid == holder.pid  # type: ignore[union-attr]
        holder.stdin.close()  # type: ignore[union-attr]  # tells it to detach and exit
        assert holder.wait(10) == 0
    finally:
        stop_process(holder)
    assert ipu_holder("cluster0", 31, tmp_path) is None


def test_listing_looks_like_gc_info(service: VipuService, tmp_path: Path) -> None:
    p4 = service.create_partition(PartitionRequest("p4", 4))
    with attach(p4, 1, device_dir=tmp_path):
        lines = listing_lines([p4], tmp_path)
    assert lines[:3] == ["Graphcore device listing:", "", "Partition: p4 [active]"]
    assert lines[3] == "-+- Id: [0], target:    [Fabric], IPU-M host: [cluster0-m00], IPU#: [0]"
    assert lines[4].endswith(f", attached: [pid {os.getpid()}]")
    assert "-+- Id: [6], target: [Multi IPU]" in lines
    assert lines[-1] == " |--- Id: [3], DNC Id: [3], IPU-M host: [cluster0-m00], IPU#: [3]"
    assert len(lines) == 3 + 4 + (2 + 2 * 2) + (1 + 4)
    assert "No partitions" in listing_lines([])[-1]
    held = service.claim_partition("p4", Lease.of_this_process("j1"))  # the service's holders are named too
    assert listing_lines([held], tmp_path)[2] == (
        f"Partition: p4 [active], held by pid {os.getpid()} on {socket.gethostname()} of job j1")
