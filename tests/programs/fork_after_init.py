"""Each instance joins the fabric, forks a child that exits normally (running atexit), then reduces.

The child inherits popdist's state and its atexit handlers; it must not close
(shut down) the parent's fabric, and it must start uninitialised itself.
Prints "<index> <sum> <child's exit code>".
"""

import os
import sys

import numpy as np

import popdist
import popdist.collectives as C

popdist.init()
C.barrier()
pid = os.fork()
if pid == 0:
    sys.exit(3 if popdist.isBackendInitialized() else 0)  # a normal exit: atexit handlers run
_, status = os.waitpid(pid, 0)
total = C.allreduce(np.array([popdist.getInstanceIndex() + 1]))
C.barrier()
print(popdist.getInstanceIndex(), int(total[0]), os.waitstatus_to_exitcode(status), flush=True)
