"""V-IPU records and the allocation rule, without I/O."""

from __future__ import annotations

import json

import pytest

from simipu.vipu import (
    Cluster,
    InvalidPartitionRequest,
    NotEnoughIpus,
    Partition,
    PartitionRequest,
    PartitionTooLarge,
    VipuProtocolError,
)
from simipu.vipu.allocation import choose_ipus
from simipu.vipu.errors import ClusterNotFound, PartitionExists, VipuError, error_from_kind
from simipu.vipu.models import DEFAULT_SYNC, SYNC_C2_COMPATIBLE


@pytest.mark.parametrize(
    "kwargs",
    [dict(size=3), dict(size=0), dict(size=-4), dict(size=True), dict(size=4.0), dict(size=8, num_gcds=3),
     dict(size=8, num_gcds=16), dict(size=4, num_ilds=3), dict(size=4, num_ilds=0), dict(size=4, name=""),
     dict(size=4, name="a/b"), dict(size=4, name="x" * 65), dict(size=4, name="-lead"),
     dict(size=4, sync_type="Bad Type"), dict(size=4, reconfigurable=True, sync_type="pod-native-default"),
     dict(size=128, num_ilds=2, reconfigurable=True), dict(size=4, reconfigurable="yes"),
     dict(size=4, cluster="bad name"), dict(size=4, sync_type="bogus"), dict(size=4, ipu_link_routing_type="ring"),
     dict(size=4, gw_link_routing_type="dnc")],
)
def test_bad_requests_are_refused_before_any_io(kwargs: dict) -> None:
    kwargs.setdefault("name", "p")
    with pytest.raises(InvalidPartitionRequest):
        PartitionRequest(**kwargs)


def test_request_defaults_follow_vipu() -> None:
    plain = PartitionRequest("p", 4)
    assert (plain.num_ilds, plain.num_gcds, plain.reconfigurable) == (1, 1, False)
    assert plain.resolved_sync_type() == DEFAULT_SYNC
    assert PartitionRequest("p", 4, reconfigurable=True).resolved_sync_type() == SYNC_C2_COMPATIBLE


def test_request_json_round_trip_and_refusals() -> None:
    request = PartitionRequest("p64", 64, cluster="c", num_gcds=4, ipu_link_routing_type="dnc")
    assert PartitionRequest.from_json(request.to_json()) == request
    assert PartitionRequest.from_json(json.dumps(request.to_json())) == request
    assert PartitionRequest.from_json({"name": "p", "size": 2}) == PartitionRequest("p", 2)
    for bad in ("[1]", "not json", {"name": "p"}, {"name": "p", "size": "4"},
                {"name": "p", "size": 4, "colour": "red"}, {"name": "p", "size": 4, "reconfigurable": 1}):
        with pytest.raises(InvalidPartitionRequest):
            PartitionRequest.from_json(bad)  # type: ignore[arg-type]


def _partition(**overrides: object) -> Partition:
    fields = dict(name="p", cluster="cluster0", size=16, num_ilds=1, num_gcds=4, reconfigurable=False,
                  ipu_link_routing_type="ringswnc", gw_link_routing_type="ring", sync_type=DEFAULT_SYNC,
                  state="PS_ACTIVE", ipus=tuple(range(16, 32)), ilds=(0,), reset_count=2)
    fields.update(overrides)
    return Partition(**fields)  # type: ignore[arg-type]


def test_partition_json_round_trip_and_derived_figures() -> None:
    partition = _partition()
    assert Partition.from_json(partition.to_json()) == partition
    assert Partition.from_json(json.dumps(partition.to_json())) == partition
    assert partition.parent_device_id == 30
    assert partition.gcds == (tuple(range(16, 20)), tuple(range(20, 24)), tuple(range(24, 28)), tuple(range(28, 32)))
    # Device 24 of a 16-IPU partition is the first 4-IPU group: partition IPUs 0-3.
    assert partition.device_ipus(24) == (16, 17, 18, 19)
    assert partition.device_ipus(27) == (28, 29, 30, 31)
    with pytest.raises(VipuProtocolError):
        Partition.from_json({"name": "p"})
    with pytest.raises(VipuProtocolError):
        Partition.from_json({**partition.to_json(), "ipus": ["0"]})


def test_partition_differences_compare_only_named_types() -> None:
    partition = _partition()
    assert partition.differences(PartitionRequest("p", 16, num_gcds=4)) == []
    assert partition.differences(PartitionRequest("p", 32, num_gcds=4, sync_type="pod-native-gw")) == ["size", "sync_type"]
    assert partition.differences(PartitionRequest("p", 16, num_gcds=4, cluster="elsewhere")) == ["cluster"]


def test_cluster_figures_and_json() -> None:
    pod256 = Cluster("big", 256)
    assert (pod256.num_ilds, pod256.ild_size, pod256.num_m2000s) == (4, 64, 64)
    assert pod256.ild_of(130) == 2
    assert Cluster("c", 16).num_ilds == 1
    assert Cluster.from_json(pod256.to_json()) == pod256


def test_allocation_is_first_fit_aligned_blocks() -> None:
    cluster = Cluster("c", 64)
    assert choose_ipus(cluster, set(), PartitionRequest("a", 4)) == (0, 1, 2, 3)
    # IPU 5 taken: the next aligned free 4-block is 8-11, not 6-9.
    assert choose_ipus(cluster, {0, 5}, PartitionRequest("b", 4)) == (8, 9, 10, 11)
    assert choose_ipus(cluster, set(range(16)), PartitionRequest("c", 16)) == tuple(range(16, 32))
    assert choose_ipus(cluster, {1}, PartitionRequest("d", 1)) == (0,)


def test_allocation_spreads_over_ilds() -> None:
    cluster = Cluster("c", 128)
    assert choose_ipus(cluster, set(), PartitionRequest("a", 128, num_ilds=2)) == tuple(range(128))
    two = choose_ipus(cluster, set(range(16)), PartitionRequest("b", 32, num_ilds=2))
    assert two == tuple(range(16, 32)) + tuple(range(64, 80))
    with pytest.raises(PartitionTooLarge, match="--num-ilds 2"):
        choose_ipus(cluster, set(), PartitionRequest("c", 128))
    with pytest.raises(PartitionTooLarge):
        choose_ipus(cluster, set(), PartitionRequest("d", 64, num_ilds=4))


def test_allocation_refusals_are_distinct() -> None:
    cluster = Cluster("c", 16)
    with pytest.raises(PartitionTooLarge):
        choose_ipus(cluster, set(), PartitionRequest("a", 32))
    with pytest.raises(NotEnoughIpus):
        choose_ipus(cluster, {3}, PartitionRequest("a", 16))
    # 12 IPUs free, but no aligned 8-block: fragmentation is also "not enough".
    with pytest.raises(NotEnoughIpus, match="12 of 16 IPUs are free"):
        choose_ipus(cluster, {0, 4, 8, 12}, PartitionRequest("a", 8))


def test_error_kinds_map_back_to_types() -> None:
    for cls in (InvalidPartitionRequest, PartitionTooLarge, NotEnoughIpus, PartitionExists, ClusterNotFound):
        rebuilt = error_from_kind(cls.kind, "message")
        assert type(rebuilt) is cls and str(rebuilt) == "message"
        assert isinstance(rebuilt, VipuError)
    assert type(error_from_kind("martian", "m")) is VipuProtocolError
