"""Each instance joins the fabric, forks a child that calls a collective, waits for it, then reduces again.

A fork is not a member of the job's fabric: its collective must fail at once, in the child, saying so.
Prints "<index> child <error type>: <message>" from the child, then "<index> parent <pid> <sum>".
"""

import os

import numpy as np

import popdist
import popdist.collectives as C

index = popdist.getInstanceIndex()
C.barrier()
pid = os.fork()
if pid == 0:  # as a DataLoader worker or a fork Pool's worker would
    try:
        C.allreduce(np.ones(1))
        print(index, "child: no error", flush=True)
    except Exception as exc:
        print(index, "child", f"{type(exc).__name__}: {exc}", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(index, "parent", os.getpid(), int(C.allreduce(np.ones(1))[0]), flush=True)
