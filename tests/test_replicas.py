"""Replica level within one instance: threads per replica, cross-replica ops, errors released."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from popdist.backend import LoneFabric
from simipu.fabric.errors import CollectiveMismatchError
from simipu.replicas import ReplicaLayout, run_replicas
from support import python_program, run_poprun

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


def _bounded(program, layout: ReplicaLayout = FOUR, fabric=None) -> BaseException | list:
    """``run_replicas(program)``'s results or the error it raised, failing the test if it has not returned
    within 30 s (a hang: the threads are daemons, so they do not keep the test process alive)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(run_replicas(program, fabric or LoneFabric(), layout))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(30)
    assert outcome, "run_replicas did not return: the replicas hang"
    return outcome[0]


@pytest.mark.parametrize("call, expected", [
    (lambda r, v: (r.cross_replica_max if r.local_index == 0 else r.cross_replica_sum)(v),
     "replica 0 called cross_replica_max on float64 (1,), replica 1 called cross_replica_sum on float64 (1,)"),
    (lambda r, v: r.cross_replica_sum(v) if r.local_index == 0 else r.cross_replica_allgather(v),
     "replica 1 called cross_replica_allgather on float64 (1,)"),
    (lambda r, v: r.cross_replica_broadcast(v, root=r.local_index % 2),
     "replica 0 called cross_replica_broadcast from replica 0 on float64 (1,), replica 1 called "
     "cross_replica_broadcast from replica 1"),
    (lambda r, v: r.cross_replica_sum(v if r.local_index == 0 else np.ones(3)),
     "replica 1 called cross_replica_sum on float64 (3,)"),
    (lambda r, v: r.cross_replica_sum(v if r.local_index < 3 else v.astype(np.float32)),
     "replica 3 called cross_replica_sum on float32 (1,)"),
], ids=["op", "kind", "root", "shape", "dtype"])
def test_replicas_making_different_calls_all_raise_a_mismatch_naming_both(call, expected) -> None:
    """Replica 0 combines for everyone: before, each got replica 0's op (the max for a sum, a sum for an
    allgather, root 0's value for root 1, a (1,) array broadcast into a (3,) one), silently."""
    error = _bounded(lambda r: call(r, np.array([float(r.index + 1)])))
    assert isinstance(error, CollectiveMismatchError), error
    assert "replicas of instance 0 made different cross-replica calls" in str(error)
    assert expected in str(error)


def test_a_replica_returning_without_the_others_call_releases_them_with_an_error() -> None:
    """Replica 1's program returns while the others wait for it in a sum: before, they waited forever."""
    def program(replica):
        if replica.index == 1:
            return None
        return replica.cross_replica_sum(np.ones(2))

    error = _bounded(program)
    assert isinstance(error, CollectiveMismatchError), error
    assert "replica 1's program returned while other replicas of instance 0 still made cross-replica calls" \
        in str(error)


def test_a_replica_returning_after_the_last_op_is_no_error() -> None:
    """Replicas that finish at different moments after their last common op: nobody is released early."""
    def program(replica):
        total = replica.cross_replica_sum(np.array([replica.index]))
        return total.tolist()  # replica 0 returns at once, while the others may not have taken theirs yet

    for _ in range(50):
        assert _bounded(program) == [[6]] * 4


def test_replicas_mismatching_through_poprun_fail_the_job_naming_the_calls() -> None:
    """Two instances of four replicas each, through the real poprun: each instance's replicas 0 take the max
    while the others take the sum; the job fails with the mismatch named, nothing left running."""
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "8",
                        *python_program("replica_calls.py", "op"))
    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, err
    assert "CollectiveMismatchError: replicas of instance" in err, err
    assert "called cross_replica_max on float64 (1,)" in err and "called cross_replica_sum" in err, err


def test_a_replica_returning_early_through_poprun_fails_the_job_instead_of_hanging() -> None:
    """Global replica 1 returns without the sum its instance's other replicas wait in: the job fails at once
    with that named (before, it hung until killed)."""
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "4",
                        *python_program("replica_calls.py", "early"))
    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, err
    assert "replica 1's program returned while other replicas of instance 0 still made cross-replica calls" in err
