"""Two instances that call different Horovod collectives (2 instances): instance 0 ``hvd.allreduce``,
instance 1 ``hvd.allgather``. The job stops with a ``CollectiveMismatchError`` that names both calls.

With argv[1] "integer-average": instance 0 ``hvd.allreduce`` of an integer tensor with op=Average, instance 1
with op=Sum; each prints "mismatch: <error>" and exits 4.
"""

import signal
import sys

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError

hvd.init()
if sys.argv[1:] == ["integer-average"]:
    # poprun stops the others once the first exits: with SIGTERM ignored, each reports first (then exits)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        hvd.allreduce(torch.tensor([10, 20]), op=hvd.Average if hvd.rank() == 0 else hvd.Sum)
    except HorovodInternalError as exc:
        print(f"mismatch: {exc}", flush=True)
        sys.exit(4)
elif hvd.rank() == 0:
    hvd.allreduce(torch.ones(4))
else:
    hvd.allgather(torch.ones(4))
