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


def test_replica_0_failing_releases_the_others() -> None:
    """Replica 0 combines for everyone: the others, waiting for its result, are released."""
    def program(replica):
        if replica.local_index == 0:
            raise ValueError("replica 0 broke")
        return replica.cross_replica_sum(np.ones(1))

    with pytest.raises(ValueError, match="replica 0 broke"):
        run_replicas(program, LoneFabric(), FOUR)


class _FailingFabric(LoneFabric):
    """An instance-level collective that fails (as a fabric whose peer died does)."""

    def allreduce(self, array, op="sum", group=None):
        raise ConnectionError("peer instance 1 is gone")


def test_a_failing_instance_collective_is_the_error_every_replica_sees() -> None:
    with pytest.raises(ConnectionError, match="peer instance 1 is gone"):
        run_replicas(lambda replica: replica.cross_replica_sum(np.ones(1)), _FailingFabric(), FOUR)


def test_a_replica_failing_between_ops_is_the_error_raised() -> None:
    """Replica 1 fails after its first op while the others go on to a second: theirs is released, and the
    error raised is replica 1's (not a lock's)."""
    def program(replica):
        first = replica.cross_replica_sum(np.ones(1))
        if replica.index == 1:
            raise ValueError("replica 1 broke after one op")
        return first, replica.cross_replica_sum(np.ones(1))

    with pytest.raises(ValueError, match="replica 1 broke after one op"):
        run_replicas(program, LoneFabric(), FOUR)


def test_many_ops_in_a_row_each_get_their_own_result() -> None:
    """Replicas run ahead of each other by up to an op: no op's values or result leak into another's."""
    def program(replica):
        for step in range(300):
            value = np.array([step * 10.0 + replica.index])
            total = replica.cross_replica_sum(value)
            assert total[0] == 4 * step * 10.0 + 6, (step, total)
            value += 1  # (the caller's array changes after the op: the result is unaffected)
            gathered = replica.cross_replica_allgather(np.array([step, replica.index]))
            assert gathered.tolist() == [[step, r] for r in range(4)], (step, gathered)
            assert replica.cross_replica_max(np.array([step + replica.index]))[0] == step + 3
        return True

    assert run_replicas(program, LoneFabric(), FOUR) == [True] * 4
