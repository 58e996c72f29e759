"""Instances as forks of the launcher, each running a Python function instead of a program.

For ``poprun_py.launch`` and the pytest plugin. A fork inherits everything the
caller has: the function with its closure, a test's resolved fixtures, the
modules already imported. So nothing is pickled on the way in, lambdas and
closures work, and an instance starts in about a millisecond, where a fresh
interpreter that imports numpy takes a tenth of a second.

Then the child becomes an instance as ``exec_program`` would have made one:
a session of its own, stdin from /dev/null, stdout and stderr on the
executor's pipes, the instance's environment in ``os.environ``, default
signal handlers (the launcher's own must not run in it), and none of the
launcher's descriptors that matter (the guardian's pipe, other instances'
devices). It ends with ``os._exit``, so no ``atexit`` handler or finaliser
inherited from the caller runs twice.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import traceback
import warnings
from typing import Callable, Collection, Mapping, NoReturn

from ..errors import EXIT_INTERNAL
from ..plan import InstancePlan

log = logging.getLogger("poprun.forked")

#: Exit code of a child whose own set-up failed: a bug of ours, as poprun's internal errors.
EXIT_SETUP_FAILED = EXIT_INTERNAL
#: Signals the launcher may handle itself; an instance starts with the defaults, as after exec.
_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                    signal.SIGALRM, signal.SIGCHLD)

Target = Callable[[InstancePlan], int]
PR_SET_PDEATHSIG = 1


class ForkedProcess:
    """The parent's handle on one forked instance: what ``LocalExecutor`` needs of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        """Reap it; like ``Popen.returncode``, -N when signal N killed it."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class ForkSpawner:
    """A ``Spawner`` whose instances run ``target(plan)`` in a fork; its return value is the exit code."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, never in a child

    def __call__(
        self, plan: InstancePlan, env: Mapping[str, str], stdout: int, stderr: int, foreign_fds: Collection[int]
    ) -> ForkedProcess:
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        parent = os.getpid()
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking with threads running; the launcher starts its own
            # only after the last fork, and the child touches nothing another thread may hold.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            _die_with(parent, self._prctl)
            _run_child(self._target, plan, env, stdout, stderr, foreign_fds, ready_w)
        os.close(ready_w)
        try:
            os.read(ready_r, 1)  # its session exists before anyone can signal its group
        finally:
            os.close(ready_r)
        return ForkedProcess(pid)


def _die_with(parent: int, prctl: Callable[..., int]) -> None:
    """SIGKILL this child if the launcher dies (``PR_SET_PDEATHSIG``).

    A fork does not carry the guardian's token in its environment as the
    kernel shows it (that is its parent's, from exec), so if the launcher died
    between this fork and handing its pidfd to the guardian, nothing could
    find it. The kernel closes that window. If the launcher is already gone,
    the child is now someone else's: it exits at once.
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(EXIT_SETUP_FAILED)


def _run_child(
    target: Target, plan: InstancePlan, env: Mapping[str, str], stdout: int, stderr: int,
    foreign_fds: Collection[int], ready: int,
) -> NoReturn:
    code = EXIT_SETUP_FAILED
    try:
        os.setsid()
        os.write(ready, b".")
        os.close(ready)
        _adopt_streams(stdout, stderr)
        for fd in foreign_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        _default_signals()
        os.environ.clear()
        os.environ.update(env)
        os.chdir(plan.cwd)
        code = target(plan)
    except BaseException:  # the target reports its own errors; this is a failure of the set-up
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def _adopt_streams(stdout: int, stderr: int) -> None:
    """stdin from /dev/null, stdout/stderr on the pipes; fresh ``sys`` streams over them.

    The caller's ``sys.stdout`` may be pytest's capture, whose state belongs to the
    parent; the instance gets plain line-buffered streams, as a program under poprun.
    """
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.close(stdout)
    os.close(stderr)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # type: ignore[misc]  # (typeshed: Final; ours here)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # type: ignore[misc]
    faulthandler.enable(file=sys.stderr)  # a crash shows its Python stack in the instance's stderr


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _DEFAULT_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
