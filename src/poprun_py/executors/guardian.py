"""The launcher's side of the guardian (see ``guardian_process.py``).

The launcher hands the guardian a pidfd for each instance right after
spawning it, over a socket pair (SCM_RIGHTS): the pidfd was opened while the
instance was the launcher's unreaped child, so it names that process and no
other, whatever happens to its PID later. If the guardian dies while the job
runs, ``replace`` starts another and hands it every pidfd still watched, so
killing the guardian first and poprun next leaves nothing behind either.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading

log = logging.getLogger("poprun.guardian")

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guardian_process.py")
#: Every instance carries this variable, the guardian's own token: see ``Guardian``.
MARKER_VARIABLE = "POPRUN_GUARDIAN_TOKEN"
#: SCM_RIGHTS carries at most 253 descriptors per message (SCM_MAX_FD).
_BATCH = 200


def _own_image() -> list[bytes]:
    """This process's start time, command line and environment: what a fork of it has until it execs.

    The guardian waits for such forks to exec (then they carry the marker) before it
    looks for the job's processes (``guardian_process._await_pending_execs``).
    """
    with open("/proc/self/stat", "rb") as stat:
        start = stat.read().rsplit(b")", 1)[1].split()[19]
    with open("/proc/self/cmdline", "rb") as cmdline, open("/proc/self/environ", "rb") as environ:
        return [b"T" + start, b"C" + cmdline.read(), b"E" + environ.read()]


class Guardian:
    """A watchdog process, outliving the launcher, that stops the job's processes if it dies.

    ``environment`` (a random token of this guardian's, in every instance's
    environment) lets the guardian also find processes it was never handed:
    an instance spawned just before the launcher was killed, or a daemon an
    instance started. One token per guardian, not the job id: the job's
    instances on other hosts carry the same job id, and "hosts" may share a
    machine (tests; containers).
    """

    def __init__(self, grace: float) -> None:
        self._grace = grace
        self.environment = {MARKER_VARIABLE: os.urandom(16).hex()}
        self._marker = f"{MARKER_VARIABLE}={self.environment[MARKER_VARIABLE]}"
        self._lock = threading.Lock()
        self._watched: dict[int, int] = {}  # pidfd (owned by the caller) -> pid
        self._closed = False
        self._process, self._socket = self._spawn()

    def _spawn(self) -> tuple[subprocess.Popen, socket.socket]:
        """The marker and this process's image are queued in the socket before the guardian
        exists: if the launcher dies the moment it is spawned, the guardian still has them."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)  # nobody reads yet: a message too large for the buffer is dropped
        try:
            ours.send(b"?" + self._marker.encode())
            for message in _own_image():
                ours.send(message)
        except OSError:
            log.debug("the guardian does not know this process's image: it waits a fixed time for late execs")
        ours.setblocking(True)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", _SCRIPT, str(self._grace), str(os.getpid())],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            theirs.close()
        return process, ours

    def kill_marked(self) -> int:
        """SIGKILL what carries this guardian's token (pidfds only); how many. See ``kill_marked``."""
        from .guardian_process import kill_marked

        return int(kill_marked(self._marker.encode()))

    @property
    def pid(self) -> int:
        return self._process.pid

    def fileno(self) -> int:
        """The launcher's end of the channel: no instance may hold it."""
        return self._socket.fileno()

    def process_fd(self) -> int:
        """A new pidfd of the guardian process (the caller closes it): readable once it has died."""
        return os.pidfd_open(self._process.pid)  # our unreaped child: the pid is still its own

    def watch(self, pid: int, pidfd: int) -> None:
        """Hand over ``pidfd`` (of process ``pid``); the caller keeps it open until ``release``."""
        with self._lock:
            if self._closed:
                return
            self._watched[pidfd] = pid
            if not self._send([pidfd]):
                self._replace_locked()

    def release(self, pidfd: int) -> None:
        """The caller is about to close ``pidfd`` (its process has exited)."""
        with self._lock:
            self._watched.pop(pidfd, None)

    def _send(self, fds: list[int]) -> bool:
        message = b"+" + b",".join(str(self._watched[fd]).encode() for fd in fds)
        try:
            socket.send_fds(self._socket, [message], fds, socket.MSG_NOSIGNAL)
        except OSError:
            return False
        return True

    def replace(self) -> int | None:
        """The guardian died: start another, hand it every pidfd still watched; its ``process_fd``.

        None once ``close`` has run: the job is over and needs no guardian.
        """
        with self._lock:
            if self._closed:
                return None
            self._replace_locked()
            return os.pidfd_open(self._process.pid)

    def _replace_locked(self) -> None:
        log.warning("the guardian (pid %d) died; starting another", self._process.pid)
        self._stop_process()
        self._process, self._socket = self._spawn()
        fds = list(self._watched)
        for start in range(0, len(fds), _BATCH):
            if not self._send(fds[start:start + _BATCH]):
                log.warning("the new guardian is gone too; instances may survive if poprun is killed")
                return

    def _stop_process(self) -> None:
        """Our own child: killing and reaping it by pid is safe until it is reaped.

        Killed before its channel closes, so it never takes the close for the launcher's death.
        """
        self._process.kill()
        self._process.wait()
        self._socket.close()

    def close(self) -> None:
        """Normal end: the launcher has stopped every process of the job itself."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._socket.send(b"=", socket.MSG_NOSIGNAL)
            except OSError:
                pass
            self._watched.clear()
            self._stop_process()
