"""Under poprun: shared-memory broadcasts and allgathers (above a board's size), each signature repeated, take
the boards once steady, also when the members' segments differ in size (a broadcast's root holds two halves of
the array, its readers none; an allgather after it inherits those sizes). Each call is preceded by a barrier,
so that a peer is seldom late past the spin (a late peer sends the call back to the general path, rightly).
Prints {"instance": i, "fallbacks": {case: calls received the general way}, "wrong": [...]}."""

import json

import numpy as np

import popdist
import popdist.collectives as C
from popdist.backend import _backend

popdist.init()
C.barrier()
fabric = _backend.fabric
fallbacks = {"broadcast": 0, "allgather": 0}
case = ["broadcast"]
general = type(fabric)._copy_fallback


def counted(self, *args, **kwargs):
    fallbacks[case[0]] += 1
    return general(self, *args, **kwargs)


type(fabric)._copy_fallback = counted
rank, n = C.rank(), C.size()
STEPS = 30
big = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB: the root's segment grows to 2 MiB, the readers' stay 1 MiB
part = np.arange(64 * 1024, dtype=np.float32)  # 256 KiB each: the allgather's segments need no growth
wrong = []
x, rows = np.empty_like(big), np.empty((n, part.size), np.float32)
for step in range(STEPS):
    x[:] = big + 1000 * rank + step
    C.barrier()
    if not np.array_equal(C.broadcast(x, 0, out=x), big + step):
        wrong.append(f"broadcast {step}")
case[0] = "allgather"
for step in range(STEPS):
    C.barrier()
    got = C.allgather(part + 1000 * rank + step, out=rows)
    if not np.array_equal(got, np.stack([part + 1000 * r + step for r in range(n)])):
        wrong.append(f"allgather {step}")
print(json.dumps({"instance": rank, "fallbacks": fallbacks, "wrong": wrong, "steps": STEPS}), flush=True)
