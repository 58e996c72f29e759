"""A host benchmark's reporting, as Graphcore's: the slowest instance's time, the total sample count."""

import horovod.torch as hvd
import torch

hvd.init()
seconds = torch.tensor([1.5 + hvd.rank()])           # this instance's time for its share
samples = torch.tensor(100 * (hvd.rank() + 1))        # and how many samples it did
slowest = max(hvd.allgather(seconds))
total = hvd.allreduce(samples, op=hvd.Sum)
print(f"rank {hvd.rank()}: slowest {slowest.item()} s, total {total.item()} samples ({total.dtype})")
