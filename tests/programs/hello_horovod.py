"""The PopDist tutorial's hello_horovod: each instance's x and y, averaged over the instances with Horovod."""

import horovod.torch as hvd
import torch

import popdist

popdist.init()
hvd.init()  # after popdist.init(): Horovod joins the same job
index = popdist.getInstanceIndex()
x = torch.tensor([1, 0], dtype=torch.float32) * index
y = torch.tensor([0, 1], dtype=torch.float16) * index
x, y = hvd.grouped_allreduce([x, y], op=hvd.Average)
print(f"instance {index} of {hvd.size()}: x = {x} y = {y}")
