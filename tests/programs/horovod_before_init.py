"""Horovod's collectives before ``hvd.init()`` and after ``hvd.shutdown()``: each refuses, as Horovod's does,
even once PopDist's collectives have joined the fabric they would use. Each rank prints its results as JSON."""

import json

import horovod.torch as hvd
import torch

import popdist.collectives

popdist.collectives.allreduce(torch.ones(2).numpy())  # (the fabric is joined: the fast paths could run)
t = torch.ones(4)
calls = {
    "allreduce": lambda: hvd.allreduce(t),
    "allreduce_": lambda: hvd.allreduce_(t),
    "grouped_allreduce": lambda: hvd.grouped_allreduce([t]),
    "allgather": lambda: hvd.allgather(t),
    "broadcast": lambda: hvd.broadcast(t, 0),
    "broadcast_": lambda: hvd.broadcast_(t, 0),
    "broadcast_object": lambda: hvd.broadcast_object({"a": 1}),
    "allgather_object": lambda: hvd.allgather_object(1),
    "barrier": lambda: hvd.barrier(),
}


def refusals() -> dict[str, str]:
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = "ran"
        except ValueError as error:
            found[name] = str(error)
    return found


before = refusals()
hvd.init()
out = {"rank": hvd.rank(), "size": hvd.size(), "before_init": before,
       "initialised": hvd.allreduce(t, op=hvd.Sum).tolist()}
hvd.shutdown()
out["after_shutdown"] = refusals()
print(json.dumps(out), flush=True)
