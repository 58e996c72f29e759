"""The guardian: stops a job's processes when the launcher dies, however it dies.

Run as ``python -I -S guardian_process.py GRACE LAUNCHER_PID`` in a session
of its own (standard library only, so it starts in milliseconds), with its
stdin one end of a SOCK_SEQPACKET socket pair. Over it the launcher sends
``?MARKER`` first (not in argv, which anyone can read) and its own start
time, command line and environment (``T``, ``C``, ``E``), then a pidfd for every
instance (``+PID,PID,...`` with the descriptors attached, SCM_RIGHTS) as soon
as the instance exists; ``=`` means a normal end: nothing to do. End of
stream without ``=``, or the launcher's own pidfd turning readable, means
the launcher died (even by SIGKILL).

Why pidfds and never ``kill(pid)``/``killpg(pgid)``: this process is not the
parent of the instances, so it cannot hold their PIDs. Once the launcher is
dead, init reaps them as they exit and their numbers can go to any process
on the host; a kill by number could hit a stranger. A pidfd names one process
for good: a signal through it reaches that process or fails with ESRCH. So
the guardian only ever signals through pidfds, and only processes it proves
to be the job's (``_discover``):

- the instances it was handed (pidfds opened by the launcher while each was
  its unreaped child, so they are the right processes);
- every live process whose initial environment holds MARKER
  (``POPRUN_GUARDIAN_TOKEN=<this guardian's random token>``): an instance's
  children and daemons inherit it, and an instance the launcher started but
  had no time to hand over carries it too;
- every live process whose parent, process group or session is a process
  already proved the job's *and still alive*: a live process holds its PID,
  so that number cannot have been reused, and a group or session bearing it
  was made by it.

A candidate is read from ``/proc`` only after its pidfd is open, and counts
only if it and its anchor are still alive after the read: then what was read
described them. The job's processes get SIGTERM, then after GRACE seconds the
survivors are frozen (SIGSTOP, so none can fork while the tree is walked)
and killed. Descriptors of processes that exit while the job runs are closed
at once, so the guardian needs one descriptor per live instance, at any size
(epoll, never ``select()`` and its 1,024-descriptor ceiling).

It imports neither ``socket``, ``selectors`` nor ``signal``: their import (the
enum classes ``socket`` and ``signal`` build above all) took ~4 ms of the
guardian's ~12 ms start-up, which runs while poprun starts the instances on a
2-core machine. ``_socket`` and ``_signal`` (the C modules those wrap, same
functions and numbers) and ``select.epoll`` do what it needs.
"""

import _signal as signal  # type: ignore[import-not-found]  # the C module behind ``signal`` (typeshed has no stub)
import _socket
import array
import os
import select
import sys
import time

#: At most this many rounds of freezing newly found processes before the kill.
_FREEZE_ROUNDS = 50
_MAX_FDS_PER_MESSAGE = 250
_MAX_MESSAGE = 1 << 20
#: The launcher's start time, command line and environment arrive in these messages.
_IMAGE_PARTS = (b"T", b"C", b"E")
#: How long to wait for the launcher's last forks to exec (``_await_pending_execs``).
_PENDING_EXEC_SECONDS = 2.0
#: How long, after the kill, to keep looking for processes of the job that exec'd late (``_sweep_late_execs``).
_LATE_EXEC_SECONDS = 10.0
_UNKNOWN_LAUNCHER_WAIT = 0.5


def _alive(pidfd):
    """A pidfd turns readable when its process exits (zombie or reaped)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def _signal(pidfd, signum):
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except OSError:  # gone already (ESRCH), or not ours to signal (EPERM)
        pass


def _read_stat(pid):
    """(state, ppid, pgrp, session) from /proc/PID/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _has_marker(pid, marker):
    if not marker:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return marker in environ.read().split(b"\0")
    except OSError:
        return False


def _live_anchor(stat, ours):
    """The first of the parent, group and session that is a live process of the job."""
    _, ppid, pgrp, session = stat
    for anchor in (ppid, pgrp, session):
        fd = ours.get(anchor)
        if fd is not None and _alive(fd):
            return fd
    return None


def _claim(pid, ours, marker):
    """A pidfd for ``pid`` if it is provably one of the job's processes, else None."""
    stat = _read_stat(pid)
    if stat is None or (_live_anchor(stat, ours) is None and not _has_marker(pid, marker)):
        return None  # a cheap first look; the proof below comes after the pidfd is open
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    stat = _read_stat(pid)
    if stat is not None:
        marked = _has_marker(pid, marker)
        if (marked or _live_anchor(stat, ours) is not None) and _alive(fd):
            return fd
    os.close(fd)
    return None


def _discover(ours, marker):
    """Add every process provably of the job to ``ours`` (pid -> pidfd); the pids added."""
    me = os.getpid()
    added = []
    while True:
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == me or pid in ours:
                continue
            fd = _claim(pid, ours, marker)
            if fd is not None:
                ours[pid] = fd
                added.append(pid)
                found += 1
        if not found:  # a child found late may anchor others: until nothing new turns up
            return added


def _recv_fds(channel, size, max_fds):
    """One message and the descriptors attached to it (SCM_RIGHTS), as ``socket.recv_fds``."""
    fds = array.array("i")
    message, ancillary, _, _ = channel.recvmsg(size, _socket.CMSG_LEN(max_fds * fds.itemsize))
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return message, list(fds)


def _wait_for_exits(fds, seconds):
    deadline = time.monotonic() + seconds
    with select.epoll() as waiting:
        left_open = 0
        for fd in fds:
            if _alive(fd):
                waiting.register(fd, select.EPOLLIN)
                left_open += 1
        while left_open:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for fd, _ in waiting.poll(left):
                waiting.unregister(fd)
                left_open -= 1


def _frozen_or_gone(pid, fd):
    stat = _read_stat(pid)
    return not _alive(fd) or stat is None or stat[0] in (b"T", b"t", b"Z", b"X")


def _freeze(ours, marker):
    """SIGSTOP the job's processes until no new one turns up and all are stopped (bounded)."""
    for _ in range(_FREEZE_ROUNDS):
        for fd in ours.values():
            _signal(fd, signal.SIGSTOP)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not all(_frozen_or_gone(p, fd) for p, fd in ours.items()):
            time.sleep(0.001)
        if not _discover(ours, marker):
            return


def _image(pid):
    """What a fork of ``pid`` shares with it until it execs: (start time, cmdline, environ), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            start = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as environ:
            return start, cmdline.read(), environ.read()
    except (OSError, IndexError, ValueError):
        return None


def _await_pending_execs(launcher):
    """Wait (bounded) until no fork of the dead launcher is still on its way to exec.

    An instance the launcher forked just before it died may not have exec'd
    yet: it has neither the marker nor a live parent, so it cannot be proved
    ours until it execs, and then it carries the marker. Such a fork has the
    launcher's command line and environment and started after it. Only
    waited for, never signalled: a look-alike only delays the stop.
    """
    if launcher is None:
        time.sleep(_UNKNOWN_LAUNCHER_WAIT)
        return
    deadline = time.monotonic() + _PENDING_EXEC_SECONDS
    while time.monotonic() < deadline and _a_fork_of(launcher):
        time.sleep(0.005)


def _a_fork_of(launcher):
    me = os.getpid()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            image = _image(int(name))
            if image is not None and image[0] >= launcher[0] and image[1:] == launcher[1:]:
                return True
    return False


def stop_job(ours, marker, grace, launcher=None):
    """SIGTERM every process of the job, SIGKILL what is left after ``grace`` seconds.

    ``launcher`` is the launcher's ``_image``, as it sent it (None if it died
    before it could: then a fixed, short wait).
    """
    _await_pending_execs(launcher)
    _discover(ours, marker)
    for fd in ours.values():
        _signal(fd, signal.SIGTERM)
        _signal(fd, signal.SIGCONT)  # (a stopped process acts on nothing else: it would wait out the grace)
    _wait_for_exits(list(ours.values()), grace)
    _freeze(ours, marker)
    for fd in ours.values():
        _signal(fd, signal.SIGKILL)
    _wait_for_exits(list(ours.values()), 5.0)
    _sweep_late_execs(ours, marker, launcher)


def _sweep_late_execs(ours, marker, launcher):
    """Kill what execs after the kill: a fork of the launcher slower than every wait above.

    On a loaded host a fork can take longer to reach exec than the scans that
    look for it (each reads every process's environment); once it execs it
    carries the marker. So for a bounded time, until no fork of the launcher
    is left and a second look finds nothing new, look again and kill it.
    """
    deadline = time.monotonic() + _LATE_EXEC_SECONDS
    quiet_looks = 0
    while time.monotonic() < deadline and quiet_looks < 2:
        time.sleep(0.1)
        late = _discover(ours, marker)
        for pid in late:
            _signal(ours[pid], signal.SIGKILL)
        pending = launcher is not None and _a_fork_of(launcher)
        quiet_looks = 0 if late or pending else quiet_looks + 1


def kill_marked(marker):
    """SIGKILL every live process carrying ``marker`` and what descends from them; how many.

    For the launcher's own use at the end of a job run in a caller's process
    (not a subreaper): the daemons its instances left.
    """
    ours: dict[int, int] = {}
    if not _discover(ours, marker):
        return 0  # the usual case: one scan of /proc
    _freeze(ours, marker)
    for fd in ours.values():
        _signal(fd, signal.SIGKILL)
    _wait_for_exits(list(ours.values()), 5.0)
    for fd in ours.values():
        os.close(fd)
    return len(ours)


def _open_launcher(pid):
    """A pidfd for the launcher, or None if it is already gone (we were reparented)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if os.getppid() != pid:  # the pid may already name another process
        os.close(fd)
        return None
    return fd


class _Watch:
    """What the launcher has told the guardian: the marker and the pidfds of live processes."""

    def __init__(self):
        self.marker = b""
        self.launcher: list[int | bytes | None] = [None, None, None]  # its _image: start time, cmdline, environ
        self.ours = {}
        self.pids_by_fd = {}  # the pidfds being watched (``watch``)
        self.normal_end = False

    def receive(self, channel, poller):
        """One message; False at the end of the stream or at ``=``. ``poller`` (epoll) gets each pidfd."""
        try:
            message, fds = _recv_fds(channel, _MAX_MESSAGE, _MAX_FDS_PER_MESSAGE)
        except BlockingIOError:
            return False
        except OSError:
            message, fds = b"", []
        if message[:1] == b"?":
            self.marker = message[1:]
        elif message[:1] in _IMAGE_PARTS:
            part = _IMAGE_PARTS.index(message[:1])
            self.launcher[part] = int(message[1:]) if part == 0 else message[1:]
        elif message[:1] == b"+":
            for pid, fd in zip(message[1:].split(b","), fds):
                self.ours[int(pid)] = fd
                self.pids_by_fd[fd] = int(pid)
                if poller is not None:
                    poller.register(fd, select.EPOLLIN)
        else:
            self.normal_end = message == b"="
            return False
        return True

    def drain(self, channel):
        """The launcher died: take what it sent before (it may have died right after)."""
        channel.setblocking(False)
        while self.receive(channel, None):
            pass


def watch(channel, launcher_fd):
    """Collect the launcher's messages until it ends, however it ends."""
    state = _Watch()
    if launcher_fd is None:
        state.drain(channel)
        return state
    channel_fd = channel.fileno()
    with select.epoll() as poller:
        poller.register(channel_fd, select.EPOLLIN)
        poller.register(launcher_fd, select.EPOLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == launcher_fd:
                    state.drain(channel)
                    return state
                if fd == channel_fd:
                    if not state.receive(channel, poller):
                        return state
                    continue
                poller.unregister(fd)  # that process exited: nothing to stop there
                os.close(fd)
                state.ours.pop(state.pids_by_fd.pop(fd), None)


def main():
    grace = float(sys.argv[1])
    launcher_pid = int(sys.argv[2])
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    channel = _socket.socket(fileno=0)
    state = watch(channel, _open_launcher(launcher_pid))
    if not state.normal_end:
        launcher = tuple(state.launcher) if None not in state.launcher else None
        stop_job(state.ours, state.marker, grace, launcher)


if __name__ == "__main__":
    main()
