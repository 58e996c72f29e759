"""Replica level within one instance: threads per replica, cross-replica ops, errors released."""

from __future__ import annotations

import numpy as np
import pytest

from popdist.backend import LoneFabric
from simipu.replicas import ReplicaLayout, run_replicas

FOUR = ReplicaLayout(num_total_replicas=4, num_local_replicas=4, replica_offset=0)


def test_each_replica_runs_with_its_index() -> None:
    assert run_replicas(lambda r: (r.index, r.local_index, r.num_replicas), LoneFabric(), FOUR) == [
        (i, i, 4) for i in range(4)
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_cross_replica_reductions(dtype) -> None:
    def program(replica):
        x = np.arange(6, dtype=dtype).reshape(2, 3) + replica.index
        return (replica.cross_replica_sum(x), replica.cross_replica_max(x), replica.cross_replica_min(x),
                replica.cross_replica_mean(x))

    base = np.arange(6, dtype=dtype).reshape(2, 3)
    for total, high, low, mean in run_replicas(program, LoneFabric(), FOUR):
        np.testing.assert_array_equal(total, 4 * base + 6)
        np.testing.assert_array_equal(high, base + 3)
        np.testing.assert_array_equal(low, base)
        np.testing.assert_allclose(mean, base + 1.5)


def test_allgather_and_broadcast_by_global_replica_index() -> None:
    def program(replica):
        value = np.full(3, replica.index, dtype=np.int32)
        return replica.cross_replica_allgather(value), replica.cross_replica_broadcast(value, root=2)

    for gathered, broadcast in run_replicas(program, LoneFabric(), FOUR):
        np.testing.assert_array_equal(gathered, np.repeat(np.arange(4, dtype=np.int32), 3).reshape(4, 3))
        np.testing.assert_array_equal(broadcast, [2, 2, 2])


def test_one_replica_failing_releases_the_others() -> None:
    def program(replica):
        if replica.index == 1:
            raise ValueError("replica 1 broke")
        return replica.cross_replica_sum(np.ones(1))  # would wait for replica 1 forever

    with pytest.raises(ValueError, match="replica 1 broke"):
        run_replicas(program, LoneFabric(), FOUR)


def test_results_are_bit_identical_across_runs() -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((4, 1000)).astype(np.float32)
    program = lambda replica: replica.cross_replica_sum(data[replica.index])  # noqa: E731
    first = run_replicas(program, LoneFabric(), FOUR)
    for _ in range(3):
        again = run_replicas(program, LoneFabric(), FOUR)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))
    assert all(r.tobytes() == first[0].tobytes() for r in first)
