"""Attaching to simulated IPU devices: one process at a time, released when it dies.

A device is a Poplar device id of a partition: a single IPU, or a group of
IPUs (device d of an N-IPU partition is S-IPU group d - (2N - 2N/S)).
Holding a device means holding an exclusive ``flock`` on one lock file per
IPU under the device directory. The kernel drops a flock when the last
descriptor closes, so the IPUs come free however the holder ends, even by
SIGKILL; no cleanup or stale-pid guessing is needed. The holder writes its
pid (and job) into each file, so a refused attach can name who has the IPU.

The lock files live in a directory only their owner can write (created
0700, refused if another user owns it or can write to it) and are opened
with ``O_NOFOLLOW``, so a planted symlink cannot make us write elsewhere.
Exclusivity between users and state directories is the V-IPU service's
(it records who holds which IPU); these locks keep it within one.

Descriptors are close-on-exec: a program the holder ``exec``s does not keep
the IPUs, but a child it ``fork``s without exec does, as with real devices.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from simipu import hardware
from simipu.private_files import UnsafePath, open_no_follow, private_dir
from simipu.vipu.api import default_state_dir
from simipu.vipu.defaults import own_state_dir
from simipu.vipu.errors import StateDirUnusable
from simipu.vipu.models import PS_ACTIVE, Partition, check_cluster_name

log = logging.getLogger("simipu.devices")


class DeviceError(Exception):
    """Base of the errors attaching can raise."""


class DeviceBusy(DeviceError):
    """Another process holds one of the device's IPUs."""

    def __init__(self, cluster: str, ipu: int, holder: Optional[IpuHolder], device: str) -> None:
        if holder is None:
            who = "another process (it has not recorded its pid yet)"
        else:
            who = f"pid {holder.pid}" + (f" of job {holder.job}" if holder.job else "")
            if holder.partition:
                who += f" (device {holder.device_id} of partition {holder.partition})"
        super().__init__(
            f"cannot attach to {device}: IPU {ipu} of {cluster} is in use by {who}; "
            "wait for it to exit, or use other IPUs"
        )
        self.cluster = cluster
        self.ipu = ipu
        self.holder = holder
        self.holder_pid = holder.pid if holder else None


class UnsafeDeviceDir(DeviceError):
    """The device directory or a lock file in it could be changed by another user (or is a symlink)."""


class DeviceDirUnusable(DeviceError):
    """The user's state directory, which holds the default device directory, cannot be used: a file is in the way,
    another user owns it (or the device directory), or the user cannot write it."""


class NoSuchDevice(DeviceError, ValueError):
    """The device id does not exist in the partition."""


class PartitionNotActive(DeviceError):
    """The partition is not PS_ACTIVE (for example PS_FAILED) and must be reset first."""


@dataclass(frozen=True)
class IpuHolder:
    """Who holds an IPU, as the holder recorded it."""

    pid: int
    job: Optional[str] = None
    partition: Optional[str] = None
    device_id: Optional[int] = None
    host: Optional[str] = None
    since: Optional[float] = None


@dataclass(frozen=True)
class DeviceInfo:
    """A device of a partition: its Poplar id and the cluster IPUs behind it."""

    id: int
    partition: str
    cluster: str
    ipus: tuple[int, ...]

    @property
    def num_ipus(self) -> int:
        return len(self.ipus)

    @property
    def tiles(self) -> int:
        return self.num_ipus * hardware.TILES_PER_IPU

    @property
    def memory_bytes(self) -> int:
        return self.num_ipus * hardware.IPU_MEMORY_BYTES


def default_device_dir() -> Path:
    """Where the per-IPU lock files live by default: ``<state dir>/devices``."""
    return default_state_dir() / "devices"


def device_info(partition: Partition, device_id: Optional[int] = None) -> DeviceInfo:
    """Describe device ``device_id`` of ``partition`` (default: the parent, holding every IPU)."""
    if device_id is None:
        device_id = partition.parent_device_id
    try:
        ipus = partition.device_ipus(device_id)
    except ValueError as exc:
        raise NoSuchDevice(f"partition {partition.name}: {exc}") from None
    return DeviceInfo(id=device_id, partition=partition.name, cluster=partition.cluster, ipus=ipus)


def partition_devices(partition: Partition) -> list[DeviceInfo]:
    """Every device of ``partition`` in id order: single IPUs, then 2-IPU groups, ... the parent."""
    return [device_info(partition, d) for d in hardware.device_ids(partition.size)]


def _lock_path(device_dir: Path, cluster: str, ipu: int) -> Path:
    try:
        check_cluster_name(cluster)
    except ValueError as exc:
        raise NoSuchDevice(str(exc)) from None
    return device_dir / cluster / f"ipu{ipu:04d}.lock"


def _private_lock_dir(device_dir: Path, cluster: str) -> None:
    """Make (or check) the device directory and its cluster directory: ours alone, as is the state directory (in
    which the default one is, refused as that directory's setting: ``own_state_dir``)."""
    if device_dir == default_device_dir():
        try:
            own_state_dir(device_dir.name, cluster)
        except StateDirUnusable as exc:
            raise DeviceDirUnusable(str(exc)) from None
        return
    try:
        private_dir(device_dir)
        private_dir(device_dir / cluster)
    except UnsafePath as exc:
        raise UnsafeDeviceDir(str(exc)) from None


def _open_lock(path: Path, flags: int) -> int:
    try:
        return open_no_follow(path, flags, 0o600)
    except UnsafePath as exc:
        raise UnsafeDeviceDir(str(exc)) from None


def _read_holder(fd: int) -> Optional[IpuHolder]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return IpuHolder(pid=int(data["pid"]), job=data.get("job"), partition=data.get("partition"),
                         device_id=data.get("device_id"), host=data.get("host"), since=data.get("since"))
    except (ValueError, TypeError, KeyError):
        return None


def ipu_holder(cluster: str, ipu: int, device_dir: Optional[os.PathLike[str] | str] = None) -> Optional[IpuHolder]:
    """Return who holds IPU ``ipu`` of ``cluster`` now, or None if it is free."""
    path = _lock_path(Path(device_dir) if device_dir else default_device_dir(), cluster, ipu)
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or IpuHolder(pid=0)
        return None
    finally:
        os.close(fd)


class Device:
    """An attached device: its IPUs are this process's until ``detach()`` or the process ends; ``attach()``
    takes them again (PopART's devices can be detached and attached again)."""

    def __init__(self, info: DeviceInfo, fds: list[int], device_dir: Optional[Path] = None,
                 job: Optional[str] = None) -> None:
        self.info = info
        self._fds = fds
        self._device_dir = device_dir or default_device_dir()  # (where its locks are, to take them again)
        self._job = job

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def ipus(self) -> tuple[int, ...]:
        return self.info.ipus

    @property
    def partition(self) -> str:
        return self.info.partition

    @property
    def cluster(self) -> str:
        return self.info.cluster

    @property
    def num_ipus(self) -> int:
        return self.info.num_ipus

    @property
    def attached(self) -> bool:
        return bool(self._fds)

    def handed_over(self) -> tuple[int, ...]:
        """Descriptors for a child to inherit (``pass_fds``): see :func:`hand_over`."""
        return hand_over(self)

    def attach(self) -> None:
        """Take the IPUs again after ``detach()`` (nothing if attached); DeviceBusy if another process has."""
        if not self._fds:
            self._fds = _lock_ipus(self.info, self._device_dir, self._job)
            log.debug("attached again to device %d of %s", self.info.id, self.info.partition)

    def detach(self) -> None:
        """Release the IPUs (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        if fds:
            log.debug("detached from device %d of %s", self.info.id, self.info.partition)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<Device {self.info.id} of {self.info.partition}: IPUs {list(self.info.ipus)}, {state}>"


def _holder_record(info: DeviceInfo, job: Optional[str]) -> bytes:
    return json.dumps({"pid": os.getpid(), "job": job, "partition": info.partition or None,
                       "device_id": info.id, "host": socket.gethostname(), "since": time.time()}).encode()


def _lock_ipus(info: DeviceInfo, device_dir: Path, job: Optional[str]) -> list[int]:
    """Take every IPU of ``info`` (in ascending order, so two attachers cannot deadlock) or none."""
    record = _holder_record(info, job)
    held: list[int] = []
    try:
        _private_lock_dir(device_dir, info.cluster)
        for ipu in sorted(info.ipus):
            fd = _open_lock(_lock_path(device_dir, info.cluster, ipu), os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                what = f"device {info.id} of partition {info.partition}" if info.partition else f"IPUs {list(info.ipus)}"
                raise DeviceBusy(info.cluster, ipu, holder, what) from None
            held.append(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def attach(partition: Partition, device_id: Optional[int] = None, *,
           device_dir: Optional[os.PathLike[str] | str] = None, job: Optional[str] = None) -> Device:
    """Attach to device ``device_id`` of ``partition`` (default: its parent device, every IPU).

    Raises PartitionNotActive if the partition is not PS_ACTIVE, NoSuchDevice
    for an id the partition does not have, DeviceBusy (naming the holder's
    pid) if another process, or another attach in this one, holds any of
    the IPUs. ``job`` is recorded for that message.
    """
    if partition.state != PS_ACTIVE:
        raise PartitionNotActive(
            f"partition {partition.name} is in state {partition.state}; reset it "
            f"(simipu vipu reset partition {partition.name}) before attaching"
        )
    info = device_info(partition, device_id)
    directory = Path(device_dir) if device_dir else default_device_dir()
    fds = _lock_ipus(info, directory, job)
    log.debug("attached to device %d of %s: IPUs %s", info.id, info.partition, list(info.ipus))
    return Device(info, fds, directory, job)


def hand_over(device: Device) -> tuple[int, ...]:
    """Descriptors for a child to inherit (``pass_fds``) so it holds ``device`` from its first instant.

    A flock belongs to the open file description, which the child shares; once
    the child runs, the giver calls ``device.detach()`` and the IPUs are the
    child's alone, never free in between (so the guide's race cannot happen).
    """
    return tuple(device._fds)


def adopt(fds: Sequence[int], device_id: int, partition: str, *, job: Optional[str] = None) -> Device:
    """Take over IPU locks inherited from the launcher (see :func:`hand_over`), naming this process as holder."""
    ipus, cluster, directory = [], "", None
    for fd in fds:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError as exc:
            raise NoSuchDevice(f"descriptor {fd} handed over for device {device_id} is not open: {exc}") from None
        if not path.name.startswith("ipu") or not path.name.endswith(".lock"):
            raise NoSuchDevice(f"descriptor {fd} handed over for device {device_id} is not an IPU lock ({path})")
        ipus.append(int(path.name[3:-5]))
        cluster, directory = path.parent.name, path.parent.parent
        os.set_inheritable(fd, False)  # the program's own children do not keep the IPUs
    info = DeviceInfo(id=device_id, partition=partition, cluster=cluster, ipus=tuple(ipus))
    record = _holder_record(info, job)
    for fd in fds:
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    return Device(info, list(fds), directory, job)


def attach_ipus(cluster: str, ipus: Sequence[int], *, device_dir: Optional[os.PathLike[str] | str] = None,
                job: Optional[str] = None) -> Device:
    """Attach to an explicit set of cluster IPUs (no partition): the low-level form of :func:`attach`."""
    if not ipus or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ipus):
        raise NoSuchDevice(f"cannot attach to IPUs {list(ipus)!r}: give one or more IPU indices >= 0")
    if len(set(ipus)) != len(ipus):
        raise NoSuchDevice(f"cannot attach to IPUs {list(ipus)!r}: an IPU appears twice")
    info = DeviceInfo(id=-1, partition="", cluster=cluster, ipus=tuple(ipus))
    directory = Path(device_dir) if device_dir else default_device_dir()
    return Device(info, _lock_ipus(info, directory, job), directory, job)


def _where(cluster: str, ipu: int) -> str:
    """An IPU's place as gc-info shows it: its IPU-M2000 and its slot there."""
    return f"IPU-M host: [{cluster}-m{hardware.m2000_of(ipu):02d}], IPU#: [{ipu % hardware.IPUS_PER_M2000}]"


def listing_lines(partitions: Iterable[Partition], device_dir: Optional[os.PathLike[str] | str] = None) -> list[str]:
    """Lines in the style of ``gc-info -l``: each partition's devices, and who holds each IPU."""
    lines = ["Graphcore device listing:"]
    for partition in partitions:
        state = "active" if partition.state == PS_ACTIVE else partition.state.removeprefix("PS_").lower()
        held = "".join(f", held by {holder.describe()}" for holder in partition.holders)
        lines += ["", f"Partition: {partition.name} [{state}]{held}"]
        devices = partition_devices(partition)
        width = len(str(devices[-1].id)) + 2
        for device in devices:
            ident = f"[{device.id}]".rjust(width)
            if device.num_ipus == 1:
                ipu = device.ipus[0]
                holder = ipu_holder(partition.cluster, ipu, device_dir)
                held = f", attached: [pid {holder.pid}]" if holder else ""
                lines.append(f"-+- Id: {ident}, target:    [Fabric], {_where(partition.cluster, ipu)}{held}")
            else:
                lines.append(f"-+- Id: {ident}, target: [Multi IPU]")
                for dnc, ipu in enumerate(device.ipus):
                    child = f"[{partition.ipus.index(ipu)}]".rjust(width)
                    lines.append(f" |--- Id: {child}, DNC Id: [{dnc}], {_where(partition.cluster, ipu)}")
    if len(lines) == 1:
        lines.append("No partitions: create one with `simipu vipu create partition NAME --size N`.")
    return lines
