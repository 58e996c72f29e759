"""Under poprun, four instances kept to two CPUs (``here`` and ``there``: more instances than CPUs) while another
process is busy on one of them: a loop of small broadcasts from instance 0, each checked. Counts the calls whose
frames did not all move through the mailboxes (the engine's fallback: the root's frames by the socket, a reader
receiving the general way). Each instance prints {"instance": i, "fallbacks": n, "calls": n, "wrong": [...]}."""

import json
import os
import sys

import numpy as np

here, there = int(sys.argv[1]), int(sys.argv[2])
os.sched_setaffinity(0, {here, there})  # (before the fabric: it sees more instances than CPUs)

import popdist  # noqa: E402
import popdist.collectives as C  # noqa: E402
from popdist.backend import _backend  # noqa: E402

popdist.init()
C.barrier()
fallbacks = [0]
general = type(_backend.fabric)._root_broadcast_fallback


def counted(self, *args, **kwargs):
    fallbacks[0] += 1
    return general(self, *args, **kwargs)


type(_backend.fabric)._root_broadcast_fallback = counted
rank, calls, wrong = C.rank(), 2000, []
x = np.empty(1024, np.float32)
for call in range(calls):
    x[:] = rank * 1000 + call
    if not (C.broadcast(x, 0, out=x) == call).all():
        wrong.append(call)
print(json.dumps({"instance": rank, "fallbacks": fallbacks[0], "calls": calls, "wrong": wrong[:5]}), flush=True)
