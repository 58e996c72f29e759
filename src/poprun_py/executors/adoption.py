"""The launcher as a child subreaper: a job's daemons come back to it and die with the job.

A process that daemonises (fork, ``setsid``, fork again, the middle one
exits) leaves its session and process group, so killing the instances'
groups misses it. With ``PR_SET_CHILD_SUBREAPER`` set on the launcher, such
an orphan is reparented to the launcher instead of init, so at the end of
the job every process of the job is either in an instance's group or a child
of the launcher.

Why signalling an adopted child by PID is safe: a child's PID stays its own
until its parent reaps it, and only the launcher reaps its children (each by
its PID, never ``wait(-1)``). So ``kill_adopted`` sends SIGKILL to each
adopted child and only then reaps it; what that child had started is
reparented to the launcher in turn and is killed in the next round.

``spared`` are the launcher's own children that are not the job's processes
(the guardian, remote agents' channels); the instances are the executor's.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from typing import Callable, Collection

from .polling import readable

log = logging.getLogger("poprun.adoption")

PR_SET_CHILD_SUBREAPER = 36
#: How long ``kill_adopted`` keeps killing what keeps appearing (a fork bomb) before it gives up.
KILL_ADOPTED_SECONDS = 10.0


def become_subreaper() -> bool:
    """Make this process adopt its descendants' orphans; False where the kernel cannot (logged)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        error = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        error = str(exc)
    log.warning("cannot adopt orphaned processes (PR_SET_CHILD_SUBREAPER: %s); daemons may outlive the job", error)
    return False


def child_pids() -> set[int]:
    """This process's children, all threads' (an orphan is adopted by any live thread)."""
    try:  # os.listdir, not glob: glob costs a launch two modules and three regular expressions
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    paths = [path for path in (f"/proc/self/task/{task}/children" for task in tasks) if os.path.exists(path)]
    if not paths:  # a kernel without CONFIG_PROC_CHILDREN: the slower scan of every process
        import psutil

        return {child.pid for child in psutil.Process().children()}
    found: set[int] = set()
    for path in paths:
        try:
            with open(path) as children:
                found.update(int(pid) for pid in children.read().split())
        except OSError:  # the thread ended
            continue
    return found


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T``, ``Z``...) from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


class Adopter:
    """Reaps and, at the end, kills the orphans the launcher adopted."""

    def __init__(self, spared: Callable[[], Collection[int]]) -> None:
        self._spared = spared

    def adopted(self, instances: Collection[int]) -> set[int]:
        return child_pids() - set(self._spared()) - set(instances)

    def reap_exited(self, instances: Collection[int]) -> None:
        """Adopted children that have exited are reaped, so zombies do not pile up in a long job."""
        for pid in self.adopted(instances):
            if process_state(pid) == "Z":
                _reap(pid)

    def kill_adopted(self, instances: Collection[int]) -> int:
        """SIGKILL and reap every adopted child until none is left (bounded); how many were killed."""
        killed = 0
        deadline = time.monotonic() + KILL_ADOPTED_SECONDS
        while time.monotonic() < deadline:
            adopted = self.adopted(instances)
            if not adopted:
                break
            fds = {}
            for pid in adopted:
                fds[pid] = os.pidfd_open(pid)  # our unreaped child: this is the process we listed
                os.kill(pid, signal.SIGKILL)
                killed += 1
            waiting = set(fds.values())
            while waiting and time.monotonic() < deadline:
                waiting.difference_update(readable(waiting, deadline - time.monotonic()))
            for pid, fd in fds.items():
                os.close(fd)
                _reap(pid)
        else:
            log.warning("processes adopted from the job kept appearing for %gs; some may survive", KILL_ADOPTED_SECONDS)
        if killed:
            log.debug("killed %d processes the job's instances left behind (daemons)", killed)
        return killed


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
