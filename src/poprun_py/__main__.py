"""``python -m poprun_py`` is ``poprun``: both come through ``run``.

``run`` is the process entry (the ``poprun`` script calls it too); it tunes the
garbage collector for a short-lived command line, which ``cli.main`` (called
in-process by tests) must not do.
"""

import gc
import sys


def run() -> int:
    """Parse, launch, return the exit code; the collector kept off the start-up path and the exit.

    Importing the CLI builds ~20,000 objects that live until exit: collecting
    them while they are made (gc.disable) and again at interpreter shutdown
    (gc.freeze moves them out of every later collection) only costs time, ~10 ms
    of a ~80 ms launch. The collector runs as usual while the job runs.
    """
    gc.disable()
    try:
        from .cli import main
    finally:
        gc.freeze()  # what the imports made lives until exit: no later collection scans it
        gc.enable()
    try:
        return main()
    finally:
        gc.freeze()  # shutdown's collections then skip what the run left alive


if __name__ == "__main__":
    sys.exit(run())
