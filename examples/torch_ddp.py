#!/usr/bin/env python3
"""torch.distributed under poprun: ``init_process_group("gloo")`` with no other arguments.

    pip install -e .                    # in a clone of poprun-py (it is not on PyPI)
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu    # torch's CPU build
    poprun --num-instances 2 --num-replicas 2 python3 examples/torch_ddp.py

poprun gives every instance RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (a free port instance 0's store binds), so
torch's default ``env://`` rendezvous needs nothing else. One DDP step
follows: gloo averages the gradients, so every rank ends with the same ones.
"""

import gc

import torch
import torch.distributed as dist

import popdist


def main() -> None:
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from poprun
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (popdist.getInstanceIndex(), popdist.getNumInstances()), "torch and PopDist disagree"
    ranks = torch.tensor([float(rank)])
    dist.all_reduce(ranks)  # sum of every rank
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(rank + 1))).sum().backward()  # this rank's gradient: 2 * (rank + 1)
    grad = model.module.weight.grad[0, 0].item()  # DDP's average over ranks: world + 1
    print(f"rank {rank} of {world}: all_reduce(sum of ranks) = {ranks.item():g}, DDP averaged gradient = {grad:g}",
          flush=True)
    # Free DDP's reducer while the process group lives, then destroy the group before the interpreter exits:
    # gloo threads still holding work at exit abort the process ("terminate called without an active
    # exception", compare pytorch/pytorch#190489): 3 runs in 12 here without this, and under torchrun too.
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
