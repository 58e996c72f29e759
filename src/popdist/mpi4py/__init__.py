"""mpi4py's API over poprun-py's fabric, for programs written for MPI (``from mpi4py import MPI``).

Under poprun, ``import mpi4py`` resolves here (see ``_poprun_py_hook``): a real MPI library can only connect
processes its own ``mpirun`` started, so under poprun each instance would be a world of its own and every
"collective" would return its own value. Outside poprun, import it by this name:
``from popdist.mpi4py import MPI`` (one process, rank 0 of 1). ``MPI.COMM_WORLD`` spans the job's instances;
MPI rank = instance index. README "Running Graphcore's programs" lists what is provided.
"""

from types import SimpleNamespace

__version__ = "4.0.0+poprun.py"  # the mpi4py release whose API this follows

#: mpi4py's run-time configuration: ``initialize`` (False: ``import mpi4py.MPI`` does not connect the instances;
#: ``MPI.Init()`` or the first call does) is followed; the rest are accepted and ignored (there is no MPI library
#: to configure).
rc = SimpleNamespace(initialize=True, threads=True, thread_level="multiple", finalize=None,
                     fast_reduce=True, recv_mprobe=True, errors="exception")
