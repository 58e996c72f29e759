"""An instance that behaves as told, depending on its instance index.

usage: behave.py [--fail INDEX MODE] [--others MODE] [--ready] [--child]

MODE: exit0, exit3, exception, sysexit_msg, keyboardinterrupt, sigkill,
sigsegv, sleep (until signalled), ignore_term (sleep, ignoring SIGTERM and
SIGINT), signals (print "instance <index> got <SIGNAME>" for each of SIGUSR1,
SIGUSR2 and SIGQUIT it receives; exit 0 after SIGQUIT, 3 if none came in
60 s). With --ready each instance prints "ready <index> <pid>" once its
signal handlers are in place, so a test synchronises on output, not sleeps.
With BEHAVE_GO_FIFO set, the failing instance waits until the test opens
that FIFO for writing (after it has seen the others' ready lines).
"""

import argparse
import os
import signal
import subprocess
import sys
import threading

import popdist

#: What the ``signals`` mode waits for (blocked from the start, so none is lost before the wait).
AWAITED = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT}


def install_handlers(mode: str) -> None:
    if mode == "signals":
        signal.pthread_sigmask(signal.SIG_BLOCK, AWAITED)
        return
    if mode == "ignore_term":
        def noted(signum, _frame):
            print(f"instance {popdist.getInstanceIndex()} ignores {signal.Signals(signum).name}", flush=True)
        signal.signal(signal.SIGTERM, noted)
        signal.signal(signal.SIGINT, noted)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def behave(mode: str) -> None:
    if mode == "exit0":
        sys.exit(0)
    if mode == "exit3":
        sys.exit(3)
    if mode == "exception":
        raise RuntimeError(f"instance {popdist.getInstanceIndex()} broke on purpose")
    if mode == "sysexit_msg":
        sys.exit("a message for sys.exit")
    if mode == "keyboardinterrupt":
        raise KeyboardInterrupt
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "signals":
        while (got := signal.sigtimedwait(AWAITED, 60)) is not None:
            print(f"instance {popdist.getInstanceIndex()} got {signal.Signals(got.si_signo).name}", flush=True)
            if got.si_signo == signal.SIGQUIT:
                sys.exit(0)
        sys.exit(3)
    if mode in ("sleep", "ignore_term"):
        install_handlers(mode)
        threading.Event().wait(120)
        sys.exit(0)
    raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", nargs=2, metavar=("INDEX", "MODE"))
    parser.add_argument("--others", default="exit0")
    parser.add_argument("--ready", action="store_true")
    parser.add_argument("--child", action="store_true", help="also start a grandchild that sleeps")
    args = parser.parse_args()
    index = popdist.getInstanceIndex()
    if args.others in ("ignore_term", "sleep", "signals"):
        install_handlers(args.others)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait(120)"])
        print(f"child {index} {child.pid}", flush=True)
    if args.ready:
        print(f"ready {index} {os.getpid()}", flush=True)
    if args.fail and int(args.fail[0]) == index:
        go = os.environ.get("BEHAVE_GO_FIFO")
        if go:
            os.close(os.open(go, os.O_RDONLY))  # blocks until the test opens it for writing
        behave(args.fail[1])
    behave(args.others)


if __name__ == "__main__":
    main()
