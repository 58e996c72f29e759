"""Figures of the simulated IPU hardware and Poplar's device-id numbering.

Poplar numbers the devices of an N-IPU partition: the single IPUs 0..N-1,
then the 2-IPU groups, then the 4-IPU groups, and so on up to the device
holding the whole partition. Launchers hand each instance the id of the
group of IPUs it owns, so these ids must match what Graphcore's tools print
(programs log them and compare them across runs).
"""

from __future__ import annotations

TILES_PER_IPU = 1472
"""Tiles of a Mk2 (GC200) IPU."""

TILE_MEMORY_BYTES = 624 * 1024
"""In-Processor memory of one tile (624 KiB)."""

IPU_MEMORY_BYTES = TILES_PER_IPU * TILE_MEMORY_BYTES
"""In-Processor memory of one IPU: 940,572,672 bytes (897 MiB).

Graphcore markets this as "900 MB"; we use the exact tile sum so that a
per-tile budget times the tile count never exceeds the IPU's budget.
"""

IPUS_PER_M2000 = 4
"""IPUs in one IPU-M2000 machine."""


def _check_count(name: str, value: int) -> None:
    """Reject non-integers (bool included) and counts below one."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def first_device_id(num_ipus: int, group_size: int) -> int:
    """Return the id of the first S-IPU group of an N-IPU partition: 2N - 2N/S.

    Poplar's numbering assumes N and S are powers of two; we only require S
    to divide N, because offline launches use partitions such as 3 replicas
    of 1 IPU. For other sizes the ids are consistent and distinct within one
    group size, but not what real hardware would report.
    """
    _check_count("num_ipus", num_ipus)
    _check_count("group_size", group_size)
    if group_size > num_ipus:
        raise ValueError(
            f"a group of {group_size} IPUs does not fit in a partition of "
            f"{num_ipus} IPUs"
        )
    if num_ipus % group_size:
        raise ValueError(
            f"a partition of {num_ipus} IPUs cannot be split into groups of "
            f"{group_size} IPUs; choose a group size that divides {num_ipus}"
        )
    return 2 * num_ipus - 2 * num_ipus // group_size


def device_id(num_ipus: int, group_size: int, group_index: int) -> int:
    """Return the id of the group_index-th S-IPU group of an N-IPU partition."""
    first = first_device_id(num_ipus, group_size)
    num_groups = num_ipus // group_size
    if not isinstance(group_index, int) or isinstance(group_index, bool):
        raise ValueError(f"group_index must be an integer, got {group_index!r}")
    if not 0 <= group_index < num_groups:
        raise ValueError(
            f"group_index {group_index} is out of range: a partition of "
            f"{num_ipus} IPUs has {num_groups} groups of {group_size} IPUs "
            f"(indices 0..{num_groups - 1})"
        )
    return first + group_index


def parent_device_id(num_ipus: int) -> int:
    """Return the id of the device holding the whole N-IPU partition (2N - 2).

    A 1-IPU partition's parent is the single IPU, id 0.
    """
    return first_device_id(num_ipus, num_ipus)


# --- IPU-Machines, IPU-PODs and IPU-Link domains ---------------------------

IPUS_PER_POD16 = 16
"""IPUs in an IPU-POD16 (4 IPU-M2000s)."""

IPUS_PER_POD64 = 64
"""IPUs in an IPU-POD64 (16 IPU-M2000s)."""

IPUS_PER_ILD = IPUS_PER_POD64
"""IPUs in one IPU-Link domain: one POD64's worth of IPU-Links."""

CLUSTER_PRESETS = {"pod16": 16, "pod64": 64, "pod128": 128, "pod256": 256}
"""Cluster sizes users name instead of counting IPUs."""


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, 8, ... (V-IPU partitions and GCDs must be such sizes)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0


def parse_cluster_size(spec: str | int) -> int:
    """Return the IPUs of a cluster named ``pod16``/``pod64``/``pod128``/``pod256`` or given as a size.

    A cluster is built from whole IPU-M2000s, and beyond one POD64 from whole
    POD64s (each is one ILD), so other sizes are refused with the nearest
    valid ones named.
    """
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in CLUSTER_PRESETS:
            return CLUSTER_PRESETS[text]
        if not text.isdigit():
            raise ValueError(
                f"unknown cluster {spec!r}: use one of {', '.join(CLUSTER_PRESETS)} or a number of IPUs"
            )
        size = int(text)
    else:
        size = spec
    _check_count("cluster size", size)
    if size % IPUS_PER_M2000:
        raise ValueError(
            f"a cluster of {size} IPUs is not made of whole IPU-M2000s ({IPUS_PER_M2000} IPUs each); "
            f"use a multiple of {IPUS_PER_M2000}"
        )
    if size > IPUS_PER_ILD and size % IPUS_PER_ILD:
        raise ValueError(
            f"a cluster of {size} IPUs is not made of whole IPU-POD64s; use a multiple of {IPUS_PER_ILD} "
            f"above {IPUS_PER_ILD} IPUs"
        )
    return size


def cluster_num_ilds(cluster_ipus: int) -> int:
    """Return the IPU-Link domains of a cluster: one per POD64 (a POD16 has one small ILD)."""
    _check_count("cluster_ipus", cluster_ipus)
    return max(1, cluster_ipus // IPUS_PER_ILD)


def ild_size(cluster_ipus: int) -> int:
    """Return the IPUs in each ILD of a cluster of ``cluster_ipus`` IPUs."""
    return cluster_ipus // cluster_num_ilds(cluster_ipus)


def m2000_of(ipu: int) -> int:
    """Return the index of the IPU-M2000 holding cluster IPU ``ipu``."""
    return ipu // IPUS_PER_M2000


def group_sizes(num_ipus: int) -> list[int]:
    """Return the group sizes Poplar offers devices for in an N-IPU partition.

    The powers of two that divide N, then N itself; their id ranges are
    contiguous and never overlap, also when N is not a power of two.
    """
    _check_count("num_ipus", num_ipus)
    sizes = []
    size = 1
    while size <= num_ipus and num_ipus % size == 0:
        sizes.append(size)
        size *= 2
    if sizes[-1] != num_ipus:
        sizes.append(num_ipus)
    return sizes


def device_ids(num_ipus: int) -> list[int]:
    """Return every device id of an N-IPU partition, ascending (0 .. 2N-2 for a power of two)."""
    return [first_device_id(num_ipus, s) + i for s in group_sizes(num_ipus) for i in range(num_ipus // s)]


def device_group(num_ipus: int, device: int) -> tuple[int, int]:
    """Return (group size S, group index) of device id ``device`` of an N-IPU partition.

    The inverse of :func:`device_id`: device d is S-IPU group d - (2N - 2N/S).
    """
    if not isinstance(device, int) or isinstance(device, bool):
        raise ValueError(f"device id must be an integer, got {device!r}")
    for size in group_sizes(num_ipus):
        first = first_device_id(num_ipus, size)
        if first <= device < first + num_ipus // size:
            return size, device - first
    raise ValueError(
        f"device id {device} does not exist in a partition of {num_ipus} IPUs "
        f"(its device ids run from 0 to {parent_device_id(num_ipus)})"
    )


def device_ipus(num_ipus: int, device: int) -> range:
    """Return the partition-relative IPU indices of device id ``device`` (a contiguous block)."""
    size, index = device_group(num_ipus, device)
    return range(index * size, (index + 1) * size)


def gcd_ipus(num_ipus: int, num_gcds: int) -> list[range]:
    """Split an N-IPU partition into ``num_gcds`` graph compile domains of equal, contiguous IPUs."""
    _check_count("num_ipus", num_ipus)
    _check_count("num_gcds", num_gcds)
    if num_ipus % num_gcds:
        raise ValueError(f"a partition of {num_ipus} IPUs cannot be split into {num_gcds} equal GCDs")
    per_gcd = num_ipus // num_gcds
    return [range(g * per_gcd, (g + 1) * per_gcd) for g in range(num_gcds)]
