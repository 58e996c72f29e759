"""Under poprun: popdist.collectives' small allreduce, broadcast and allgather, called again with the same arrays,
call the fabric's board plans themselves (a frame nearer than ``Fabric``'s methods), and stay right: new values
each step, a late peer on one step (its peers' calls give up waiting and the general path receives), a subgroup
(``execute_on_instances``: the general path), then a mismatch, after which the same calls raise at once.
Prints {"instance": i, "entered": {method: calls of Fabric's}, "wrong": [...], "after": [error types],
"frames": {collective: the Python frames one more hot call entered}}."""

import json
import sys
import time

import numpy as np

import popdist
import popdist.collectives as C
from popdist.backend import _backend

popdist.init()
C.barrier()
fabric = _backend.fabric
entered = {"allreduce": 0, "broadcast": 0, "allgather": 0}


def counting(name):
    method = getattr(type(fabric), name)

    def counted(self, *args, **kwargs):
        entered[name] += 1
        return method(self, *args, **kwargs)
    return counted


for name in entered:
    setattr(type(fabric), name, counting(name))

rank, n = C.rank(), C.size()
base = np.arange(1024, dtype=np.float32)
x, out = np.empty_like(base), np.empty_like(base)
b = np.empty_like(base)
g, rows = np.empty(256, np.float32), np.empty((n, 256), np.float32)
wrong = []


def check(label, got, want):
    if not np.array_equal(got, want):
        wrong.append(label)


for step in range(6):
    if step == 3 and rank == 0:
        time.sleep(0.2)  # (late: the peers' calls wait past their spin; the results must not change)
    x[:] = base + 1000 * rank + step
    check(f"allreduce out {step}", C.allreduce(x, "sum", out=out), n * base + 1000 * n * (n - 1) // 2 + n * step)
    check(f"allreduce {step}", C.allreduce(x, "max"), base + 1000 * (n - 1) + step)
    b[:] = base + 1000 * rank + step
    check(f"broadcast new {step}", C.broadcast(b, 1), base + 1000 + step)
    check(f"broadcast in place {step}", C.broadcast(b, 1, out=b), base + 1000 + step)
    g[:] = base[:256] + 1000 * rank + step
    check(f"allgather {step}", C.allgather(g, out=rows), np.stack([base[:256] + 1000 * r + step for r in range(n)]))
hot = dict(entered)


#: The frames of a wait for a peer, or of waking one (``Spreader.beside`` and what it calls: a wait's too).
WAITS = {"await_alone", "await_crowded", "nudge", "beside", "spread", "crowded_move"}


def frames_of(call):
    """The Python frames a call enters (C functions not counted), but those that wait for a peer or wake one:
    the fewest over ten calls. A peer late past the spin sends a call the general way: such a call's frames are
    cut where it falls back (``_hot_fallback``), and count only if every call fell back."""
    seen = []
    for _ in range(10):
        names = []

        def profile(frame, event, arg, names=names):
            if event == "call" and frame.f_code.co_name not in WAITS:
                names.append(frame.f_code.co_name)
        sys.setprofile(profile)
        try:
            call(x, "sum", out=out) if call is C.allreduce else call(g, out=rows)
        finally:
            sys.setprofile(None)
        fell_back = "_hot_fallback" in names
        seen.append((fell_back, len(names), names[:names.index("_hot_fallback")] if fell_back else names))
    return min(seen)[2]


frames = {"allreduce": frames_of(C.allreduce), "allgather": frames_of(C.allgather)}
x[:] = base + rank
members = {0, n - 1}
got = C.execute_on_instances(members, C.allreduce, x, "sum", out=out)
if rank in members:
    check("subgroup", got, sum(base + r for r in members))
subgroup = entered["allreduce"] - hot["allreduce"]
after = []
for call in (lambda: C.allreduce(np.zeros(7 + (rank == 0), np.float32)), lambda: C.allreduce(x, "sum", out=out)):
    try:
        call()
        after.append(None)
    except Exception as exc:  # noqa: BLE001  (the type is the result)
        after.append(type(exc).__name__)
print(json.dumps({"instance": rank, "entered": hot, "wrong": wrong, "after": after,
                  "subgroup": subgroup, "frames": frames}), flush=True)
