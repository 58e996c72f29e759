"""An instance that starts a daemon the classic way (fork, setsid, fork) and prints its pid.

usage: daemonize.py [--clean-env] [--stay]

The daemon is ``sleep 1000`` in a session of its own, its stdio on /dev/null
(so it holds none of the instance's pipes). With ``--clean-env`` it runs with
an empty environment: no marker of poprun's or of the test's reaches it.
With ``--stay`` the instance prints "ready" and sleeps too, so the job runs
until it is stopped; otherwise it exits 0 once the daemon runs.
"""

import os
import sys


def start_daemon(clean_env: bool) -> int:
    report_r, report_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve("/bin/sleep", ["sleep", "1000"], {} if clean_env else dict(os.environ))
        os.write(report_w, str(daemon).encode())
        os._exit(0)
    os.close(report_w)
    pid = int(os.read(report_r, 32))
    os.waitpid(middle, 0)  # the middle one is gone: the daemon is an orphan now
    return pid


def main() -> None:
    daemon = start_daemon("--clean-env" in sys.argv)
    print(f"daemon {daemon}", flush=True)
    if "--stay" in sys.argv:
        print(f"ready {os.getpid()}", flush=True)
        os.execv("/bin/sleep", ["sleep", "1000"])


if __name__ == "__main__":
    main()
