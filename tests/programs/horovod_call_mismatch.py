"""Two instances that call different Horovod collectives (2 instances): instance 0 ``hvd.allreduce``,
instance 1 ``hvd.allgather``. The job stops with a ``CollectiveMismatchError`` that names both calls."""

import horovod.torch as hvd
import torch

hvd.init()
if hvd.rank() == 0:
    hvd.allreduce(torch.ones(4))
else:
    hvd.allgather(torch.ones(4))
