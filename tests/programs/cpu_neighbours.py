"""Under poprun, two instances on a host with a CPU for each, put on one CPU (``here``) while another process
holds the other (``there``): the kernel's balancer sees two busy CPUs either way and may leave them so. Each
notes the CPU it is on after each of a few thousand small allreduces; instance 0 prints {"together": the calls
after which both were on one CPU, "calls": how many, "masks": each one's CPUs at the end}."""

import json
import os
import sys

import numpy as np

import popdist
import popdist.collectives as C
from simipu.fabric.algorithms.placement import _current_cpu

here, there = int(sys.argv[1]), int(sys.argv[2])
popdist.init()
os.sched_setaffinity(0, {here})  # (the kernel's choice, made for it: both on one CPU)
C.barrier()
os.sched_setaffinity(0, {here, there})
x = np.full(1024, C.rank() + 1, np.float32)
out = np.empty_like(x)
cpus = np.empty(3000, np.int64)
for call in range(cpus.size):
    C.allreduce(x, "sum", out=out)
    cpus[call] = _current_cpu()
assert (out == 3).all(), out[:4]
everyone = C.allgather(cpus)
masks = C.allgather(np.array(sorted(os.sched_getaffinity(0)), np.int64))
if C.rank() == 0:
    print(json.dumps({"together": int((everyone[0] == everyone[1]).sum()), "calls": cpus.size,
                      "masks": masks.tolist()}), flush=True)
