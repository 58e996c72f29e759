"""Under poprun: ``hvd.allreduce`` of a float32 CPU tensor, called again with the same tensor, calls the fabric's
plan itself, as ``popdist.collectives.allreduce`` does (``Fabric.allreduce``'s checks were a fifth of the gap to
the plain call at 256 KiB). Prints {"rank": r, "size": n, "wrong": [...], "frames": {bytes: the files and
functions one more call entered}}."""

import json
import os
import sys

import horovod.torch as hvd
import torch

hvd.init()
rank, n = hvd.rank(), hvd.size()
wrong = []
frames = {}
WAITS = {"await_alone", "await_crowded", "nudge", "beside", "spread", "crowded_move"}
for nbytes in (4096, 262144):
    t = torch.arange(nbytes // 4, dtype=torch.float32) + 1000 * rank
    want = n * torch.arange(nbytes // 4, dtype=torch.float32) + 1000 * n * (n - 1) // 2
    for step in range(3):
        if not torch.equal(hvd.allreduce(t, op=hvd.Sum), want):
            wrong.append(f"{nbytes} step {step}")
    seen = []
    for _ in range(10):  # (the fewest frames of ten calls: a late peer sends a call the general way)
        names = []

        def profile(frame, event, arg, names=names):
            if event == "call" and frame.f_code.co_name not in WAITS:
                names.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
        sys.setprofile(profile)
        try:
            got = hvd.allreduce(t, op=hvd.Sum)
        finally:
            sys.setprofile(None)
        if not torch.equal(got, want):
            wrong.append(f"{nbytes} profiled")
        seen.append((len(names), names))
    frames[nbytes] = min(seen)[1]
print(json.dumps({"rank": rank, "size": n, "wrong": wrong, "frames": frames}), flush=True)
