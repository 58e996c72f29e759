"""Each instance joins its job's fabric, then runs poprun_py.launch: the launch's instances (forks of this
instance, with an environment of their own job) must join their own fabric; this instance's still works.
Prints "<index> <the launch's results> <this job's sum>".
"""

import numpy as np

import popdist
import popdist.collectives as C
import poprun_py

index = popdist.getInstanceIndex()
C.barrier()
results = poprun_py.launch(lambda: int(C.allreduce(np.array([popdist.getInstanceIndex() + 1]))[0]), num_instances=3,
                           timeout=60)
print(index, results, int(C.allreduce(np.ones(1))[0]), flush=True)
