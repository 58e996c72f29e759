"""Under poprun: a steady shared-memory allgather and broadcast (above a board's size), each signature's plan
kept from call to call, interleaved with calls that change the arena under them: another layout (a broadcast
from another root, which must first drain the segments, so its first call goes the general way) and a larger
allgather (which grows and remaps every segment). Each call's values are new and checked. A plan kept past such
a change would skip the drain (every member alike, so no error, but a peer may still read what we overwrite).
Prints {"instance": i, "wrong": [...], "steady": calls that took the steady path, "calls": steady-shaped calls}."""

import json

import numpy as np

import popdist
import popdist.collectives as C
from popdist.backend import _backend

popdist.init()
C.barrier()
fabric = _backend.fabric
steady = [0]
taken = type(fabric)._copy_steady


def counted(self, *args, **kwargs):
    took = taken(self, *args, **kwargs)
    steady[0] += bool(took)
    return took


type(fabric)._copy_steady = counted
rank, n = C.rank(), C.size()
part = np.arange(64 * 1024, dtype=np.float32)  # 256 KiB each: the shared segments
rows = np.empty((n, part.size), np.float32)
wrong, calls = [], 0
for round_ in range(4):
    for step in range(5):  # the steady allgather: its plan made at its second call, then kept
        calls += 1
        value = 100 * round_ + step
        got = C.allgather(part + 1000 * rank + value, out=rows)
        if not np.array_equal(got, np.stack([part + 1000 * r + value for r in range(n)])):
            wrong.append(f"allgather {round_}.{step}")
    for step in range(3):  # the steady broadcast from the last member
        calls += 1
        x = part + 1000 * rank + round_
        if not np.array_equal(C.broadcast(x, n - 1, out=x), part + 1000 * (n - 1) + round_):
            wrong.append(f"broadcast {round_}.{step}")
    if round_ == 1:  # every segment grows (remapped: a new epoch), then the smaller calls again
        big = np.arange(1024 * 1024, dtype=np.float32) + rank
        if not np.array_equal(C.allgather(big), np.stack([big - rank + r for r in range(n)])):
            wrong.append("large allgather")
print(json.dumps({"instance": rank, "wrong": wrong, "steady": steady[0], "calls": calls}), flush=True)
