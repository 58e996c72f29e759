"""Horovod's API over poprun-py's fabric, for programs written for Horovod (``import horovod.torch as hvd``).

Under poprun, ``import horovod`` resolves here (see ``_poprun_py_hook``), because the real Horovod can only
connect processes that ``horovodrun`` or ``mpirun`` started. Outside poprun, import it by this name:
``import popdist.horovod.torch as hvd``. Only ``horovod.torch`` is provided (README "Running Graphcore's
programs" has the list of what works).
"""

__version__ = "0.28.1+poprun.py"  # the Horovod release whose API this follows
