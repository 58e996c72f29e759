"""One process of a job started by a launcher other than poprun (PopTorch's "distributed execution
without PopRun"): ``worker.py [PROCESS_ID NUM_PROCESSES]``. With no arguments, the process's place is
left to Options' defaults (Open MPI's variables). Prints the sample indices of each local replica per item."""

import json
import sys

import numpy as np

import popdist
from popdist.data import DataLoader

options = popdist.Options().replicationFactor(2).randomSeed(42)
if len(sys.argv) == 3:
    options.Distributed.configureProcessId(int(sys.argv[1]), int(sys.argv[2]))
loader = DataLoader(options, np.arange(100), batch_size=3, shuffle=True, drop_last=False)
print(json.dumps({
    "process": options.Distributed.processId,
    "processes": options.Distributed.numProcesses,
    "items": [[batch.tolist() for batch in step] for step in loader],
}), flush=True)
