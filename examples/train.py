#!/usr/bin/env python3
"""Data-parallel training of a small NumPy network on handwritten digits, under poprun or alone.

    poprun --num-instances 2 --num-replicas 4 python3 examples/train.py
    python3 examples/train.py                       # 1 instance, 1 replica: the same training

What happens, as the Graphcore talk describes it: every replica starts from
the same weights (replica 0's, broadcast to all); each reads its own slice
of every global batch (``popdist.data``: split by instance, then by local
replica); each computes the gradient of its slice; the gradients are summed
across all replicas (``cross_replica_sum``, in a fixed order) and every
replica applies the same update. ``--batch-size`` is the *global* batch, so 1
replica or 16 train on the same batches with the same learning rate: the
same loss curve, to float64 rounding (only the order of the gradient sum
differs). Instance 0 reports; the checkpoint is saved once, by instance 0.

Data: the UCI optical handwritten digits (1797 8x8 images, CC BY 4.0), which
ships inside popdist (``popdist.datasets.load_digits``); 360 are held out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import popdist
import popdist.collectives as C
from popdist import replicas
from popdist.data import DataLoader, epoch_order
from popdist.datasets import DIGITS_SAMPLES, load_digits
from popdist.env_names import CONSOLE_IS_TERMINAL

TEST_SAMPLES = 360
TRAIN_SAMPLES = DIGITS_SAMPLES - TEST_SAMPLES
CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training set (default 10)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch: samples per weight update across all replicas (default 64)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default 0.5)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    parser.add_argument("--seed", type=int, default=42, help="weights and shuffling (default 42)")
    parser.add_argument("--checkpoint", default="checkpoints/digits-mlp.npz",
                        help="where instance 0 saves the weights and history ('' for none)")
    parser.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                        help="progress bar from instance 0; auto: when the console is a terminal")
    parser.add_argument("--metrics-json", default="", help="instance 0 writes timings here (benchmarks/scaling.py)")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size > TRAIN_SAMPLES:  # (else an epoch has no step)
        parser.error(f"--batch-size {args.batch_size} is larger than the {TRAIN_SAMPLES} training samples; "
                     f"it is the global batch, at most {TRAIN_SAMPLES}")
    return args


# -- the network: 64 -> hidden (ReLU) -> 10 (softmax), parameters in one flat float64 vector ------------
def shapes(hidden: int) -> list[tuple[int, ...]]:
    return [(64, hidden), (hidden,), (hidden, CLASSES), (CLASSES,)]


def unflatten(flat: np.ndarray, hidden: int) -> list[np.ndarray]:
    """Views into ``flat``: W1, b1, W2, b2."""
    views, start = [], 0
    for shape in shapes(hidden):
        size = int(np.prod(shape))
        views.append(flat[start:start + size].reshape(shape))
        start += size
    return views


def initial_weights(hidden: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flat = np.zeros(sum(int(np.prod(s)) for s in shapes(hidden)))
    w1, _, w2, _ = unflatten(flat, hidden)
    w1[:] = rng.standard_normal(w1.shape) * np.sqrt(2 / 64)
    w2[:] = rng.standard_normal(w2.shape) * np.sqrt(1 / hidden)
    return flat


def logits(flat: np.ndarray, hidden: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w1, b1, w2, b2 = unflatten(flat, hidden)
    h = np.maximum(x @ w1 + b1, 0.0)
    return h, h @ w2 + b2


def gradient_sum(flat: np.ndarray, hidden: int, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> tuple[float, int]:
    """Write the *sum* over the batch of per-sample gradients into ``out``; return (loss sum, correct)."""
    _, _, w2, _ = unflatten(flat, hidden)
    g1, gb1, g2, gb2 = unflatten(out, hidden)
    h, z = logits(flat, hidden, x)
    correct = int((z.argmax(axis=1) == y).sum())
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y]).sum())
    p[rows, y] -= 1.0  # d(loss sum)/d(logits)
    g2[:] = h.T @ p
    gb2[:] = p.sum(axis=0)
    dh = p @ w2.T
    dh[h <= 0] = 0.0
    g1[:] = x.T @ dh
    gb1[:] = dh.sum(axis=0)
    return loss, correct


# -- reporting from instance 0 ---------------------------------------------------------------------
class Progress:
    """A one-line bar redrawn with \\r on stdout, then replaced by the epoch's line."""

    def __init__(self, enabled: bool, steps: int) -> None:
        self.enabled, self.steps = enabled, steps

    def step(self, epoch: int, epochs: int, done: int) -> None:
        if self.enabled:
            filled = 30 * done // self.steps
            print(f"\repoch {epoch}/{epochs} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.steps}",
                  end="", flush=True)

    def line(self, text: str) -> None:
        print(("\r\x1b[K" if self.enabled else "") + text, flush=True)


def progress_wanted(choice: str) -> bool:
    if choice != "auto":
        return choice == "on"
    return sys.stdout.isatty() or os.environ.get(CONSOLE_IS_TERMINAL) == "1"


# -- one replica's program --------------------------------------------------------------------------
def train_replica(replica, args, train: DataLoader, test: DataLoader, reporter: Progress | None) -> dict:
    """Run in one thread per local replica; returns the final weights, history and timings."""
    reporter = reporter if replica.local_index == 0 else None
    flat = initial_weights(args.hidden, args.seed) if replica.index == 0 else \
        np.zeros(sum(int(np.prod(s)) for s in shapes(args.hidden)))
    flat = replica.cross_replica_broadcast(flat, root=0)  # identical starting weights everywhere
    grads = np.zeros(flat.size + 3)  # the gradient sum, then loss sum, correct, count: one collective per step
    history, samples, step_seconds, collective_seconds, train_seconds = [], 0.0, 0.0, 0.0, 0.0
    for epoch in range(args.epochs):
        loss = correct = count = 0.0
        started = time.perf_counter()
        for done, (x, y) in enumerate(train.replica_batches(replica.local_index, epoch), 1):
            step_start = time.perf_counter()
            grads[-3:-1] = gradient_sum(flat, args.hidden, x, y, grads[:-3])
            grads[-1] = len(y)
            collective_start = time.perf_counter()
            total = replica.cross_replica_sum(grads)
            collective_seconds += time.perf_counter() - collective_start
            flat -= (args.lr / total[-1]) * total[:-3]  # the mean gradient of the global batch
            loss, correct, count = loss + total[-3], correct + total[-2], count + total[-1]
            step_seconds += time.perf_counter() - step_start
            if reporter is not None:
                reporter.step(epoch + 1, args.epochs, done)
        seconds = time.perf_counter() - started
        train_seconds, samples = train_seconds + seconds, samples + count
        test_correct, test_count = evaluate(replica, flat, args.hidden, test, epoch)
        history.append((loss / count, correct / count, test_correct / test_count))
        if reporter is not None:
            reporter.line(f"epoch {epoch + 1:>2}/{args.epochs}  loss {loss / count:.4f}  "
                          f"train acc {100 * correct / count:5.1f}%  test acc {100 * test_correct / test_count:5.1f}%  "
                          f"{count / seconds:>9,.0f} samples/s")
    return {"weights": flat, "history": np.array(history), "samples": samples,
            "train_seconds": train_seconds, "step_seconds": step_seconds, "collective_seconds": collective_seconds}


def evaluate(replica, flat: np.ndarray, hidden: int, test: DataLoader, epoch: int) -> tuple[float, float]:
    """Held-out accuracy: each replica scores its share (uneven at the tail), the counts are summed."""
    counts = np.zeros(2)
    for x, y in test.replica_batches(replica.local_index, epoch):
        if len(y):
            counts += ((logits(flat, hidden, x)[1].argmax(axis=1) == y).sum(), len(y))
    correct, total = replica.cross_replica_sum(counts)
    return correct, total


# -- the instance ----------------------------------------------------------------------------------
def save_checkpoint(path: str, weights: np.ndarray, history: np.ndarray, args: argparse.Namespace) -> None:
    """Write a temporary file beside ``path``, sync it, then rename it over ``path``.

    The rename is atomic: a save interrupted at any point (Ctrl-C, poprun's SIGTERM after another
    instance failed, a full disk) leaves the previous checkpoint whole. Saving to ``path`` itself would
    truncate it first.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # (the same file system: rename is atomic)
    try:
        with open(temporary, "wb") as file:
            np.savez(file, weights=weights, history=history, hidden=args.hidden, lr=args.lr,
                     batch_size=args.batch_size, replicas=popdist.getNumTotalReplicas())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    print(f"checkpoint saved by instance {popdist.getInstanceIndex()}: {path}", flush=True)


def digits_split(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    images, labels = load_digits()
    order = epoch_order(len(labels), seed=seed)  # the same split on every instance and host
    train, test = order[:-TEST_SAMPLES], order[-TEST_SAMPLES:]
    return (images[train], labels[train]), (images[test], labels[test])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    popdist.init()
    options = popdist.Options().randomSeed(args.seed)  # replicas, instance index and count come from poprun
    total, me = options.total_replicas, popdist.getInstanceIndex()
    if args.batch_size % total:
        raise SystemExit(f"--batch-size {args.batch_size} is the global batch and must be a multiple of the "
                         f"{total} replicas; try --batch-size {args.batch_size // total * total or total}")
    train_set, test_set = digits_split()
    train = DataLoader(options, train_set, batch_size=args.batch_size // total, shuffle=True, drop_last=True)
    test = DataLoader(options, test_set, batch_size=64, drop_last=False)
    reporter = None
    if me == 0:
        print(f"training a 64-{args.hidden}-10 network on {len(train_set[1])} handwritten digits "
              f"({len(test_set[1])} held out): {popdist.getNumInstances()} instance(s) x "
              f"{options.replication_factor} replica(s) = {total} replicas, global batch {args.batch_size} "
              f"({args.batch_size // total} per replica), lr {args.lr}, {args.epochs} epoch{'s' * (args.epochs != 1)}",
              flush=True)
        reporter = Progress(progress_wanted(args.progress), len(train))

    results = replicas.run(train_replica, args, train, test, reporter)  # one thread per local replica
    weights = results[0]["weights"]
    if any(r["weights"].tobytes() != weights.tobytes() for r in results):
        raise SystemExit(f"instance {me}: its replicas' weights differ; data-parallel training is broken")
    digest = hashlib.sha256(weights.tobytes()).digest()
    every = C.allgather(np.frombuffer(digest, dtype=np.uint8))
    offset, local = popdist.getReplicaIndexOffset(), options.replication_factor
    print(f"instance {me}: replicas {offset}-{offset + local - 1}, {len(train) * args.batch_size // total * local} "
          f"training samples per epoch, weights sha256 {digest.hex()[:16]}", flush=True)
    if not (every == every[0]).all():
        raise SystemExit(f"instance {me}: the instances' weights differ; data-parallel training is broken")
    mine = results[0]
    if args.checkpoint:
        popdist.execute_on_instances({0}, save_checkpoint, args.checkpoint, weights, mine["history"], args)
    if me == 0:
        report(args, total, mine)
    return 0


def report(args: argparse.Namespace, total: int, mine: dict) -> None:
    loss, _, test_accuracy = mine["history"][-1]
    rate = mine["samples"] / mine["train_seconds"]
    share = mine["collective_seconds"] / mine["step_seconds"]
    print(f"weights bit-identical on every replica ({total}); final loss {loss:.4f}, test accuracy "
          f"{100 * test_accuracy:.1f}% ({round(test_accuracy * TEST_SAMPLES)}/{TEST_SAMPLES}); "
          f"{mine['samples']:,.0f} samples in {mine['train_seconds']:.2f} s = {rate:,.0f} samples/s; "
          f"collectives {100 * share:.0f}% of each step", flush=True)
    if args.metrics_json:
        Path(args.metrics_json).write_text(json.dumps({
            "instances": popdist.getNumInstances(), "replicas": total, "samples": mine["samples"],
            "train_seconds": mine["train_seconds"], "samples_per_second": rate,
            "step_seconds": mine["step_seconds"], "collective_seconds": mine["collective_seconds"],
            "collective_share": share, "final_loss": loss, "test_accuracy": test_accuracy,
        }))


if __name__ == "__main__":
    sys.exit(main())
