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
