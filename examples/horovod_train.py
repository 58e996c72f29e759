"""Data-parallel training written the way Graphcore's PyTorch examples are: ``popdist.poptorch.Options`` for this
instance's place in the job, Horovod for the collectives on the host, a checkpoint saved by instance 0 alone.

    poprun --num-instances 2 --num-replicas 2 python3 examples/horovod_train.py --checkpoint model.pt

Under poprun ``import horovod.torch`` is poprun-py's (no Horovod or MPI needed). A linear model learns
y = X w + b from synthetic data; each instance trains on its own shard, and ``DistributedOptimizer``
averages the gradients, so every instance holds the same weights after every step.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import horovod.torch as hvd
import torch

import popdist
import popdist.poptorch

TRUE_WEIGHTS = torch.tensor([[2.0], [-1.0], [0.5]])
TRUE_BIAS = 0.25


def dataset(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data on every instance (one seed); each takes its shard below."""
    generator = torch.Generator().manual_seed(42)
    x = torch.randn(samples, 3, generator=generator)
    y = x @ TRUE_WEIGHTS + TRUE_BIAS + 0.01 * torch.randn(samples, 1, generator=generator)
    return x, y


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str, step: int) -> None:
    """Save to a temporary file beside ``path``, sync it, then rename it over ``path`` (atomic): a save
    interrupted at any point leaves the previous checkpoint whole, where ``torch.save(..., path)`` would
    truncate it first."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # (the same file system: rename is atomic)
    try:
        with open(temporary, "wb") as file:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    print(f"instance {popdist.getInstanceIndex()} saved the checkpoint of step {step} to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="model.pt", help="where instance 0 saves the model")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per instance per step")
    args = parser.parse_args()
    for name in ("steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    if popdist.isPopdistEnvSet():
        popdist.init()
    hvd.init()
    options = popdist.poptorch.Options()  # as for a PopTorch model: local replicas, process index and count
    index, count = options.Distributed.processId, options.Distributed.numProcesses

    x, y = dataset(args.batch_size * count * 8)
    x, y = x[index::count], y[index::count]  # this instance's shard

    torch.manual_seed(index)  # every instance starts from other weights ...
    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # ... until instance 0's are everyone's
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    batches = x.shape[0] // args.batch_size
    for step in range(1, args.steps + 1):
        start = (step % batches) * args.batch_size
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[start:start + args.batch_size]), y[start:start + args.batch_size])
        loss.backward()
        optimizer.step()  # averages the gradients over the instances first
        mean_loss = hvd.allreduce(loss.detach(), name="loss")  # the job's loss, on every instance
        if index == 0 and step % 20 == 0:
            print(f"step {step}: loss {mean_loss.item():.5f}")

    popdist.execute_on_instances({0}, save_checkpoint, model, optimizer, args.checkpoint, args.steps)
    weights = torch.cat([model.weight.detach().reshape(-1), model.bias.detach()])
    same = torch.equal(hvd.allreduce(weights, op=hvd.Max), hvd.allreduce(weights, op=hvd.Min))
    print(f"instance {index} of {count}: weights {[round(w, 3) for w in weights.tolist()]}, "
          f"the same on every instance: {same}")


if __name__ == "__main__":
    main()
