"""``python -m poprun_py`` is ``poprun``: both come through ``run``.

``run`` is the process entry (the ``poprun`` script calls it too); it tunes the
garbage collector for a short-lived command line and ends the process itself,
which ``cli.main`` (called in-process by tests) must not do.
"""

import atexit
import gc
import os
import sys
from typing import NoReturn


def run() -> int:
    """Parse, launch, end the process with the exit code; the collector kept off the start-up path.

    Importing the CLI builds ~20,000 objects that live until exit: collecting
    them while they are made (gc.disable) only costs time, ~10 ms of a ~80 ms
    launch; gc.freeze moves them out of every later collection. The collector
    runs as usual while the job runs.
    """
    gc.disable()
    try:
        from .cli import main
    finally:
        gc.freeze()  # what the imports made lives until exit: no later collection scans it
        gc.enable()
    code = main()
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """End the process as ``sys.exit`` would, less the interpreter's own teardown.

    By now the job is over and every process of it reaped: finalizing the
    interpreter would only free, one by one, the modules and objects the
    process is about to lose anyway (~3-5 ms of a launch). What an exit must
    still do is done here: the ``atexit`` handlers (logging's flush; on a
    remote launch, paramiko's), then stdout and stderr flushed (a stream whose
    reader left gets /dev/null, so the code stays ours).
    """
    from .console import quiet_closed_streams

    atexit._run_exitfuncs()
    quiet_closed_streams()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(run())
