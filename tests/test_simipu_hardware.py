"""Device-id numbering against the figures Graphcore's tools printed."""

from __future__ import annotations

import pytest

from simipu import hardware
from simipu.hardware import device_id, first_device_id, parent_device_id


def test_hardware_figures() -> None:
    assert hardware.TILES_PER_IPU == 1472
    assert hardware.IPUS_PER_M2000 == 4
    assert hardware.IPU_MEMORY_BYTES == 1472 * 624 * 1024
    # Graphcore's "900 MB": within 5% of it either way.
    assert abs(hardware.IPU_MEMORY_BYTES - 900 * 10**6) < 0.05 * 900 * 10**6


@pytest.mark.parametrize(
    ("num_ipus", "group_size", "first"),
    [(1, 1, 0), (2, 1, 0), (2, 2, 2), (4, 2, 4), (4, 4, 6), (16, 1, 0),
     (16, 2, 16), (16, 4, 24), (16, 16, 30), (64, 64, 126), (64, 4, 96)],
)
def test_first_device_id(num_ipus: int, group_size: int, first: int) -> None:
    assert first_device_id(num_ipus, group_size) == first


def test_ids_of_all_groups_are_distinct_and_cover_0_to_2n_minus_2() -> None:
    n = 16
    ids = [device_id(n, s, i) for s in (1, 2, 4, 8, 16) for i in range(n // s)]
    assert ids == list(range(2 * n - 1))


def test_reference_launch_8_replicas_4_instances_2_ipus() -> None:
    # N = 8 replicas x 2 IPUs, S = 2 local replicas x 2 IPUs.
    assert [device_id(16, 4, i) for i in range(4)] == [24, 25, 26, 27]


@pytest.mark.parametrize(("num_ipus", "parent"), [(1, 0), (2, 2), (4, 6), (16, 30), (64, 126)])
def test_parent_device_id(num_ipus: int, parent: int) -> None:
    assert parent_device_id(num_ipus) == parent


def test_non_power_of_two_partition_is_allowed_offline() -> None:
    assert [device_id(3, 1, i) for i in range(3)] == [0, 1, 2]
    assert parent_device_id(3) == 4


@pytest.mark.parametrize(
    ("num_ipus", "group_size"),
    [(0, 1), (4, 0), (-4, 2), (4, 3), (4, 8), (6, 4), (4.0, 2), (True, 1), ("4", 2)],
)
def test_bad_partition_or_group_raises(num_ipus: object, group_size: object) -> None:
    with pytest.raises(ValueError):
        first_device_id(num_ipus, group_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("index", [-1, 4, 100, 1.0, None])
def test_group_index_out_of_range_raises(index: object) -> None:
    with pytest.raises(ValueError, match="group_index"):
        device_id(16, 4, index)  # type: ignore[arg-type]


def test_last_group_index_is_accepted() -> None:
    assert device_id(16, 4, 3) == 27
