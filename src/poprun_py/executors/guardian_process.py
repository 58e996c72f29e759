"""The guardian: kills a job's instances when the launcher dies, however it dies.

Run as ``python -I -S guardian_process.py GRACE`` in a session of its own
(standard library only, so it starts in milliseconds). The launcher writes
``+PGID`` for each instance's process group and ``-PGID`` once a group is
gone. End of input means the launcher died (even by SIGKILL): every group
still listed gets SIGTERM, then SIGKILL after GRACE seconds. At a normal end
the launcher stops every group itself and then kills the guardian.
One guardian per job, not a process per instance.
"""

import os
import select
import signal
import sys
import time


def _stop_groups(groups, grace):
    leaders = []
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            continue
        try:
            leaders.append(os.pidfd_open(pgid))
        except (OSError, AttributeError):
            pass
    deadline = time.monotonic() + grace
    while leaders:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(leaders, [], [], left)
        for fd in ready:
            leaders.remove(fd)
            os.close(fd)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def main():
    grace = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    groups = set()
    for line in sys.stdin.buffer:
        line = line.strip()
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
    _stop_groups(groups, grace)


if __name__ == "__main__":
    main()
