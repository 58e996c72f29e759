"""Sharding a dataset by instance and then by local replica, the same way on every host.

**Order.** Each epoch reads the dataset in one order: the identity, or with
``shuffle`` a permutation that every instance computes alike from
``(seed, epoch)``. The permutation comes from an integer hash, not from
NumPy's generators, whose streams may change between NumPy versions (and two
hosts may not have the same one).

**Layout.** The order is consumed one weight update at a time. Update *u*
takes the next ``U = batch_size x gradient_accumulation x total replicas``
samples and splits them by instance and then by local replica: global
replica *k* gets the contiguous run ``[k*b, (k+1)*b)`` of the update, with
``b = batch_size x gradient_accumulation``. So the samples of every update
depend only on the global batch size ``U``, not on how many instances and
replicas share it: 1 replica with a batch of 64 and 8 replicas with 8 each
see the same global batches in the same order. (PopTorch's DataLoader gives
each process a contiguous block of the epoch instead, so its global batches
change with the number of processes.) One item (one iteration of a loader)
is ``device_iterations`` updates; a replica's rows in it are laid out
``[device iteration][accumulation][micro-batch]``, as PopTorch lays out a
combined batch.

**Tails.** With ``drop_last=True`` (the default, as in PopTorch) the samples
after the last full item are left out of that epoch; with ``shuffle`` they
are other samples every epoch. With ``drop_last=False`` one more, smaller
item holds them, divided among all replicas as evenly as possible in
global replica order (the first ``r`` replicas get one sample more, and a
replica may get none). Every instance then yields the same number of items,
so no collective waits for an instance that has run out. That last item has
no ``[device iteration][accumulation]`` structure, and its replicas' batches
differ in size: reduce sums (and the sample count) across replicas, then divide.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from popdist.options import ReplicaSettings

__all__ = ["DataLoader", "Sharding", "epoch_order"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _integer(value: Any) -> int | None:
    """``value`` as an int if it is an integer (NumPy's too; not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _epoch(epoch: Any) -> int:
    value = _integer(epoch)
    if value is None:
        raise ValueError(f"epoch must be an integer, got {epoch!r}")
    return value


def epoch_order(num_samples: int, *, seed: int | None = None, epoch: int = 0, shuffle: bool = True) -> np.ndarray:
    """The order an epoch reads the samples in: int64 indices, identical on every host for the same arguments.
    Any integer is an epoch (a negative one too, as torch's samplers take it), taken modulo 2**64."""
    epoch = _epoch(epoch) % 2**64
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    if seed is None:
        raise ValueError("shuffling needs a seed that every instance shares: call options.randomSeed(n) "
                         "with the same n on every instance")
    with np.errstate(over="ignore"):
        stream = _mix(np.array([seed], dtype=np.uint64) * _GOLDEN + _mix(np.array([epoch], dtype=np.uint64)))
        keys = _mix(np.arange(1, num_samples + 1, dtype=np.uint64) * _GOLDEN + stream)
    return np.argsort(keys, kind="stable").astype(np.int64)


@dataclass(frozen=True)
class Sharding:
    """Which samples each of this process's replicas reads, item by item (see the module docstring)."""

    num_samples: int
    batch_size: int  # the micro-batch of one replica
    settings: ReplicaSettings = ReplicaSettings()
    shuffle: bool = False
    drop_last: bool = True

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size"):
            value, least = getattr(self, name), 0 if name == "num_samples" else 1
            count = _integer(value)
            if count is None or count < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
            object.__setattr__(self, name, count)  # (a NumPy integer, as len() of an array gives, as a plain int)
        if self.shuffle and self.settings.random_seed is None:
            raise ValueError("shuffle=True needs a seed that every instance shares, so that all of them shuffle "
                             "alike: call options.randomSeed(n) with the same n on every instance")

    @property
    def replica_rows(self) -> int:
        """Rows one replica reads per update: micro-batch x gradient accumulation."""
        return self.batch_size * self.settings.gradient_accumulation

    @property
    def update_size(self) -> int:
        """Samples per weight update across all replicas: the global batch."""
        return self.replica_rows * self.settings.total_replicas

    @property
    def item_size(self) -> int:
        """Samples per full item across all replicas (``device_iterations`` updates)."""
        return self.update_size * self.settings.device_iterations

    @property
    def full_items(self) -> int:
        return self.num_samples // self.item_size

    @property
    def tail(self) -> int:
        """Samples after the last full item: left out (``drop_last``) or read as one smaller item."""
        return self.num_samples - self.full_items * self.item_size

    def __len__(self) -> int:
        return self.full_items + (1 if self.tail and not self.drop_last else 0)

    def item_total(self, item: int) -> int:
        """Samples in ``item`` across all replicas (the global batch of an item)."""
        if not 0 <= item < len(self):
            raise IndexError(f"item {item} does not exist: an epoch has {len(self)}")
        return self.item_size if item < self.full_items else self.tail

    def indices(self, epoch: int = 0) -> list[tuple[np.ndarray, ...]]:
        """For each item of ``epoch``: one index array per local replica, in local replica order."""
        s = self.settings
        order = epoch_order(self.num_samples, seed=s.random_seed, epoch=epoch, shuffle=self.shuffle)
        full = order[: self.full_items * self.item_size].reshape(
            self.full_items, s.device_iterations, s.total_replicas, self.replica_rows)
        mine = full[:, :, s.replica_offset: s.replica_offset + s.replication_factor, :]
        per_replica = mine.transpose(0, 2, 1, 3).reshape(
            self.full_items, s.replication_factor, s.device_iterations * self.replica_rows)
        items = [tuple(replicas) for replicas in per_replica]
        if self.tail and not self.drop_last:
            items.append(self._tail_indices(order[self.full_items * self.item_size:]))
        return items

    def _tail_indices(self, rest: np.ndarray) -> tuple[np.ndarray, ...]:
        s = self.settings
        share, extra = divmod(len(rest), s.total_replicas)
        bounds = np.cumsum([0] + [share + (k < extra) for k in range(s.total_replicas)])
        return tuple(rest[bounds[k]: bounds[k + 1]]
                     for k in range(s.replica_offset, s.replica_offset + s.replication_factor))


class DataLoader:
    """Per-replica batches of a NumPy dataset for this process, sharded as the module docstring says.

    ``dataset`` is an array, a list of samples (made one array, as torch's
    DataLoader takes a list), or a tuple of arrays with the same first
    dimension (e.g. ``(images, labels)``); a batch is the same structure with
    the rows picked. ``batch_size`` is one replica's micro-batch, as in
    PopTorch. ``iter(loader)`` yields, per item, a tuple of the local
    replicas' batches and moves to the next epoch (a new shuffle) for the
    next pass; ``replica_batches(local_index, epoch)`` yields one replica's
    batches, for a replica's own thread (see ``popdist.replicas.run``).
    """

    def __init__(self, options: Any, dataset: Any, batch_size: int = 1, *,
                 shuffle: bool = False, drop_last: bool = True) -> None:
        settings = _replica_settings(options)
        self._arrays, self._single = _as_arrays(dataset)
        self.sharding = Sharding(len(self._arrays[0]), batch_size, settings, shuffle, drop_last)
        self.epoch = 0

    @property
    def combinedBatchSize(self) -> int:
        """Rows this process reads per full item (PopTorch's name): batch x iterations x replicas x accumulation."""
        return self.sharding.item_size // self.sharding.settings.num_processes

    def __len__(self) -> int:
        return len(self.sharding)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s order next (e.g. when resuming from a checkpoint)."""
        self.epoch = _epoch(epoch)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        for replicas in self.sharding.indices(epoch):
            yield tuple(self._take(rows) for rows in replicas)

    def replica_batches(self, local_index: int, epoch: int) -> Iterator[Any]:
        """Local replica ``local_index``'s batch of each item of ``epoch``."""
        count = self.sharding.settings.replication_factor
        if not 0 <= local_index < count:
            raise IndexError(f"local replica {local_index} does not exist: this process has {count}")
        for replicas in self.sharding.indices(epoch):
            yield self._take(replicas[local_index])

    def _take(self, rows: np.ndarray) -> Any:
        if self._single:
            return self._arrays[0][rows]
        return tuple(array[rows] for array in self._arrays)


def _replica_settings(options: Any) -> ReplicaSettings:
    """The settings of ``popdist.Options``, ``popdist.poptorch.Options`` (also over real PopTorch), or a snapshot."""
    if isinstance(options, ReplicaSettings):
        return options
    try:  # popdist.Options and PopTorch's own (popdist.poptorch.Options over real PopTorch) share the names
        return ReplicaSettings.of(options)
    except AttributeError:
        raise TypeError(f"options must be popdist.Options or popdist.poptorch.Options, "
                        f"not {type(options).__name__}") from None


def _as_arrays(dataset: Any) -> tuple[Sequence[np.ndarray], bool]:
    if isinstance(dataset, list):  # a list of samples, as torch's DataLoader takes it (before, its items were
        dataset = _samples(dataset)  # taken as a tuple's arrays: 10 samples of 2 features made 2 samples)
    single = not isinstance(dataset, tuple)
    arrays = [np.asarray(a) for a in ([dataset] if single else dataset)]
    if not arrays or any(a.ndim == 0 for a in arrays):
        raise TypeError("dataset must be an array, a list of samples or a tuple of arrays indexed by sample along "
                        "the first axis")
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"the dataset's arrays have different numbers of samples: {[len(a) for a in arrays]}")
    return arrays, single


def _samples(dataset: list) -> np.ndarray:
    """A list of samples as one array of them; samples that do not make one (of different shapes, or
    (features, label) pairs) are refused with the form that takes them."""
    try:
        array = np.asarray(dataset)
    except ValueError:
        array = None
    if array is None or array.dtype == object:
        raise TypeError("a list dataset is a list of samples, which must make one array (the same shape and type "
                        "each); for (features, label) pairs pass a tuple of arrays, e.g. "
                        "(np.stack(features), np.array(labels))")
    return array
