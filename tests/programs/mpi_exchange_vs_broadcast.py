"""An all-to-all of messages against a small broadcast from rank 0 (3 or more instances, all on one host): the
first argument is the exchange (``alltoall`` or ``Alltoall``), the second the broadcast (``bcast``, ``Bcast``,
``scatter`` or ``Scatter``), the third who makes the exchange: ``root`` (rank 0; the others broadcast) or
``others`` (rank 0 broadcasts); a fourth, ``large``, makes ``Alltoall``'s blocks 320 KB (their bytes travel
apart from their envelopes, past a link's read-ahead). Each rank ends of its own error: SIGTERM is ignored, so
poprun's stop after the first failure cannot cut another rank short before it says what it saw."""

import signal
import sys

import numpy as np
from mpi4py import MPI

signal.signal(signal.SIGTERM, signal.SIG_IGN)
comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
exchange, broadcast, who = sys.argv[1:4]
block = 40000 if sys.argv[4:] == ["large"] else 1
if (r == 0) == (who == "root"):
    if exchange == "alltoall":
        comm.alltoall(list(range(n)))
    else:
        comm.Alltoall(np.zeros(n * block), np.zeros(n * block))
elif broadcast == "bcast":
    comm.bcast("from rank 0" if r == 0 else None, root=0)
elif broadcast == "Bcast":
    comm.Bcast(np.zeros(4), root=0)
elif broadcast == "scatter":
    comm.scatter(list(range(n)) if r == 0 else None, root=0)
else:
    comm.Scatter(np.zeros(n) if r == 0 else None, np.zeros(1), root=0)
print(f"rank {r} returned from its call", flush=True)
