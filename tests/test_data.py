"""popdist.data: sharding by instance then replica, identical shuffles, tails, and the loader."""

from __future__ import annotations

import numpy as np
import pytest

from popdist.data import DataLoader, Sharding, epoch_order
from popdist.options import ReplicaSettings


def layouts(num_samples: int, batch_size: int, instances: int, local: int, **kw) -> list[Sharding]:
    """One Sharding per instance of a job, as each instance would build it."""
    shuffle, drop_last = kw.pop("shuffle", True), kw.pop("drop_last", True)
    return [Sharding(num_samples, batch_size, ReplicaSettings(replication_factor=local, process_id=i,
                                                             num_processes=instances, random_seed=7, **kw),
                     shuffle=shuffle, drop_last=drop_last)
            for i in range(instances)]


def global_batches(shardings: list[Sharding], epoch: int = 0) -> list[list[np.ndarray]]:
    """Per item, every replica's rows in global replica order (instance by instance)."""
    per_instance = [s.indices(epoch) for s in shardings]
    return [[rows for items in per_instance for rows in items[item]] for item in range(len(per_instance[0]))]


def test_the_order_is_pinned_so_every_host_and_numpy_version_agrees() -> None:
    # computed by integer hashing, not NumPy's generators: these values must never change
    assert epoch_order(10, seed=1, epoch=0).tolist() == [5, 7, 8, 2, 9, 0, 3, 1, 6, 4]
    assert epoch_order(10, seed=1, epoch=1).tolist() == [7, 4, 9, 0, 2, 8, 3, 5, 6, 1]
    assert epoch_order(5, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n", [0, 1, 2, 1797])
def test_the_order_is_a_permutation_that_changes_with_seed_and_epoch(n: int) -> None:
    order = epoch_order(n, seed=3, epoch=2)
    assert sorted(order.tolist()) == list(range(n)) and order.dtype == np.int64
    if n > 100:
        assert not np.array_equal(order, epoch_order(n, seed=3, epoch=3))
        assert not np.array_equal(order, epoch_order(n, seed=4, epoch=2))


@pytest.mark.parametrize("instances,local", [(1, 1), (1, 4), (2, 1), (2, 2), (2, 4), (4, 2)])
def test_every_update_reads_the_same_global_batch_whatever_the_topology(instances: int, local: int) -> None:
    global_batch = 64
    reference = epoch_order(1000, seed=7, epoch=5)
    shards = layouts(1000, global_batch // (instances * local), instances, local)
    batches = global_batches(shards, epoch=5)
    assert len(batches) == 1000 // global_batch
    for u, replicas in enumerate(batches):
        # split by instance then by local replica: contiguous runs in global replica order
        np.testing.assert_array_equal(np.concatenate(replicas), reference[u * global_batch:(u + 1) * global_batch])


@pytest.mark.parametrize("n,batch,instances,local", [(100, 3, 2, 2), (1437, 8, 2, 4), (17, 2, 3, 1), (5, 1, 2, 4)])
def test_without_drop_last_every_sample_is_read_once_and_tails_are_as_even_as_possible(
        n: int, batch: int, instances: int, local: int) -> None:
    shards = layouts(n, batch, instances, local, drop_last=False)
    assert len({len(s) for s in shards}) == 1  # every instance yields as many items: no collective waits forever
    batches = global_batches(shards)
    seen = np.concatenate([rows for replicas in batches for rows in replicas])
    assert sorted(seen.tolist()) == list(range(n))
    tail = n % (batch * instances * local)
    if tail:
        sizes = [len(rows) for rows in batches[-1]]
        assert sum(sizes) == tail == shards[0].item_total(len(shards[0]) - 1)
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_with_drop_last_the_tail_is_skipped_and_another_one_each_epoch() -> None:
    shards = layouts(70, 4, 2, 2)  # global batch 16: 4 items, 6 samples left out
    assert len(shards[0]) == 4 and shards[0].tail == 6
    skipped = []
    for epoch in range(2):
        seen = np.concatenate([r for replicas in global_batches(shards, epoch) for r in replicas])
        assert len(seen) == 64 == len(set(seen.tolist()))
        skipped.append(set(range(70)) - set(seen.tolist()))
    assert skipped[0] != skipped[1]
    unshuffled = layouts(70, 4, 2, 2, shuffle=False)
    assert np.concatenate(global_batches(unshuffled)[-1]).tolist() == list(range(48, 64))


def test_device_iterations_and_accumulation_keep_updates_topology_independent() -> None:
    # an item = 2 device iterations; an update = 3 accumulated micro-batches of 2 per replica
    one = layouts(200, 24, 1, 1, device_iterations=2, gradient_accumulation=1)
    four = layouts(200, 2, 2, 2, device_iterations=2, gradient_accumulation=3)
    assert one[0].update_size == four[0].update_size == 24 and four[0].item_size == 48
    rows_one = global_batches(one)[0][0]  # 48 rows: [iteration][micro-batch]
    replicas = global_batches(four)[0]
    assert all(len(r) == 12 for r in replicas)  # [iteration 2][accumulation 3][micro-batch 2]
    for d in range(2):
        update = np.concatenate([r.reshape(2, 6)[d] for r in replicas])
        np.testing.assert_array_equal(update, rows_one[d * 24:(d + 1) * 24])


def test_shuffling_needs_a_seed() -> None:
    with pytest.raises(ValueError, match="randomSeed"):
        Sharding(10, 2, ReplicaSettings(), shuffle=True)
    with pytest.raises(ValueError, match="randomSeed"):
        epoch_order(10, seed=None)


def test_loader_yields_per_replica_batches_of_every_array() -> None:
    images = np.arange(40, dtype=np.float64).reshape(20, 2)
    labels = np.arange(20) * 10
    settings = ReplicaSettings(replication_factor=2, process_id=1, num_processes=2, random_seed=1)
    loader = DataLoader(settings, (images, labels), batch_size=2, shuffle=True)
    assert len(loader) == 2 and loader.combinedBatchSize == 4
    first = list(loader)
    assert len(first) == 2 and all(len(step) == 2 for step in first)
    for x, y in (batch for step in first for batch in step):
        assert x.shape == (2, 2) and np.array_equal(x[:, 0] * 5, y)  # rows stay paired across arrays
    second = list(loader)  # the next pass is the next epoch: a new shuffle
    assert any(not np.array_equal(a[1], b[1]) for s, t in zip(first, second) for a, b in zip(s, t))
    mine = [y for _, y in loader.replica_batches(1, epoch=0)]
    assert all(np.array_equal(a, step[1][1]) for a, step in zip(mine, first))


def test_loader_rejects_what_it_cannot_shard() -> None:
    with pytest.raises(ValueError, match="different numbers of samples"):
        DataLoader(ReplicaSettings(), (np.zeros(3), np.zeros(4)))
    with pytest.raises(TypeError, match="popdist.Options"):
        DataLoader({"replicas": 2}, np.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="has 1"):
        next(DataLoader(ReplicaSettings(), np.zeros(3)).replica_batches(1, 0))


def test_a_list_is_a_list_of_samples_as_torchs_dataloader_takes_it() -> None:
    """10 rows of 2 features in a list are 10 samples (before: a tuple of 10 arrays of 2 samples each)."""
    rows = [[k, k + 100] for k in range(10)]
    loader = DataLoader(ReplicaSettings(), rows, batch_size=2)
    assert len(loader) == 5
    assert [batch.tolist() for (batch,) in loader] == [rows[k: k + 2] for k in range(0, 10, 2)]
    assert len(DataLoader(ReplicaSettings(), list(range(10)), batch_size=5)) == 2
    with pytest.raises(TypeError, match=r"for \(features, label\) pairs pass a tuple of arrays"):
        DataLoader(ReplicaSettings(), [(np.zeros(3), 1), (np.zeros(3), 0)])


def test_numpy_integers_and_negative_epochs_are_taken_other_values_refused_in_one_line() -> None:
    """len() of an array and NumPy arithmetic give np.int64 batch sizes (refused before, 'must be an integer');
    a negative epoch ended in an OverflowError from NumPy when shuffling."""
    settings = ReplicaSettings(random_seed=1)
    assert len(DataLoader(settings, np.arange(10), np.int64(2))) == 5
    assert sorted(epoch_order(5, seed=1, epoch=-1).tolist()) == list(range(5))
    assert epoch_order(5, seed=1, epoch=-1).tolist() == epoch_order(5, seed=1, epoch=2**64 - 1).tolist()
    loader = DataLoader(settings, np.arange(8), 2, shuffle=True)
    loader.set_epoch(np.int64(-1))
    assert sorted(np.concatenate([batch for (batch,) in loader]).tolist()) == list(range(8))
    for bad in (1.5, "1", True):
        with pytest.raises(ValueError, match="epoch must be an integer"):
            loader.set_epoch(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            DataLoader(settings, np.arange(8), bad)  # type: ignore[arg-type]
