"""``python -m poprun_py`` is ``poprun``: both come through ``run``.

``run`` is the process entry (the ``poprun`` script calls it too); it tunes the
garbage collector for a short-lived command line and ends the process itself,
which ``command.main`` (called in-process by tests) must not do.
"""

import atexit
import gc
import io
import os
import sys
from typing import NoReturn, TextIO

from .errors import EXIT_INTERRUPTED


def run() -> int:
    """Parse, launch, end the process with the exit code; the collector kept off the start-up path.

    Importing the CLI builds ~20,000 objects that live until exit: collecting
    them while they are made (gc.disable) only costs time, ~10 ms of a ~80 ms
    launch; gc.freeze moves them out of every later collection. The collector
    runs as usual while the job runs.

    A Ctrl-C before ``command.main``'s own handler is in place (while the CLI is
    imported, the first ~0.1 s) ends as one after it does: one line, 130, and
    no traceback.
    """
    open_closed_standard_fds()  # first: nothing may have taken fd 0, 1 or 2 yet
    try:
        gc.disable()
        try:
            from .command import main
        finally:
            gc.freeze()  # what the imports made lives until exit: no later collection scans it
            gc.enable()
        code = main()
    except KeyboardInterrupt:
        from .console import say

        say("poprun: interrupted")
        code = EXIT_INTERRUPTED
    exit_now(code)


def open_closed_standard_fds() -> None:
    """Open /dev/null on whichever of fds 0, 1 and 2 is closed, as mpirun and most Unix tools do.

    ``poprun ... 2>&-``: otherwise the next descriptor poprun opens gets the
    number 2 (the guardian's socket, say), and what poprun writes to "stderr"
    (an instance's stderr lines) goes there. Python made ``sys.stdin``/
    ``stdout``/``stderr`` None for a closed fd; they are rebuilt on /dev/null.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:  # (open takes the lowest free fd, and the lower ones are open by now: not expected)
                os.dup2(null, fd)
                os.close(null)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            stream = _text_stream(fd)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def _text_stream(fd: int) -> TextIO:
    """A text stream on ``fd`` as Python makes its standard ones (stderr: line-buffered, never fails to encode)."""
    if fd == 0:
        return io.TextIOWrapper(io.FileIO(fd, "r", closefd=False), encoding=sys.getfilesystemencoding(),
                                errors="surrogateescape")
    errors = "backslashreplace" if fd == 2 else "surrogateescape"
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=sys.getfilesystemencoding(),
                            errors=errors, line_buffering=True)


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
