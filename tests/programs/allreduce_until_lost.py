"""Allreduce in a loop until the fabric fails, then say so as one JSON line.

Prints "ready <index> <pid>" after the first allreduce (so a test knows the job is mid-collective),
then loops; when a collective raises, prints {"instance": i, "error": type, "message": text} and
exits 1.
"""

import json
import os

import numpy as np

import popdist
import popdist.collectives as C

popdist.init()
me = popdist.getInstanceIndex()
data = np.full(1 << 14, me + 1, dtype=np.float32)
try:
    C.allreduce(data)
    print(f"ready {me} {os.getpid()}", flush=True)
    while True:
        C.allreduce(data)
except Exception as exc:  # noqa: BLE001 - report whatever the fabric raised
    print(json.dumps({"instance": me, "error": type(exc).__name__, "message": str(exc)}), flush=True)
    raise SystemExit(1) from None
