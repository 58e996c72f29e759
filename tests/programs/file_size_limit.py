"""Run a Python script whose writes to regular files fail past a size: ``file_size_limit.py BYTES SCRIPT [ARGS]``.

``RLIMIT_FSIZE`` is set to BYTES and SIGXFSZ ignored, so a write that would take a file past BYTES fails
with EFBIG, deterministically and part way through: the script's save is interrupted as a full disk, a
Ctrl-C or poprun's SIGTERM would interrupt it, at a point the test chooses. Pipes (its output) are not
limited. The script runs as ``__main__`` in this process, so the limit holds from its first line.
"""

import resource
import runpy
import signal
import sys

limit, script = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.argv = sys.argv[2:]
sys.dont_write_bytecode = True  # (a module's cached bytecode is a file too)
runpy.run_path(script, run_name="__main__")
