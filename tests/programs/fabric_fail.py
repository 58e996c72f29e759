"""Fabric failure cases under poprun.

usage: fabric_fail.py MODE
  killed      instance 1 SIGKILLs itself as the others enter an allreduce;
              survivors ignore SIGTERM (so only the fabric can end them) and
              print "lost: <error>" when the allreduce raises
  late DIR    instance 1 never joins the fabric; the others wait in init(), which instances 0 and 2
              enter together (each leaves a file in DIR and waits for the other's), so that however
              slowly each process starts, only instance 1 is late
  leaves      instance 1 exits at once, without joining the fabric; the others print "refused: <error>"
              when their first collective raises
  stopped     instance 1 stops itself (SIGSTOP) after a barrier; the others print "lost: <error>" when
              their allreduce raises; on SIGTERM (once continued) instance 1 prints "stopped instance:
              SIGTERM handled" and exits with 0
  gil FIFO    after an allreduce, instance 1 opens FIFO for reading through libc, holding the GIL (its
              heartbeat thread cannot run) until the test opens it for writing; then every instance
              prints "second: <sum>" of a second allreduce
  finalized DIR
              after a barrier, instance 1 calls popdist.finalizeBackend() and stays alive until each other
              instance has left a file in DIR; the others print "lost: <error>" when their allreduce raises,
              then leave theirs
  exits       after a barrier, instance 1 exits with code 0; the others print "lost: <error>" when their
              allreduce raises
  mismatch    instance 0 reduces 3 floats, the others 4
  roots       instance 0 broadcasts 4 floats from root 0, the others from root 1 (each root writes and
              returns: nobody compares the calls), then the program ends
  roots-then  as roots, then a barrier: each prints "mismatch: <error>" when it raises
  wrong-token instance 0 joins with a token it made up
"""

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import popdist
import popdist.collectives as C
from simipu.fabric import CollectiveMismatchError, PeerLostError, RendezvousError


def enter_together(directory: Path, me: int, instances: tuple[int, ...], limit: float = 60.0) -> None:
    """Return once each of ``instances`` has reached this point (or after ``limit`` s, to never hang)."""
    (directory / f"started-{me}").touch()
    deadline = time.monotonic() + limit
    while not all((directory / f"started-{i}").exists() for i in instances) and time.monotonic() < deadline:
        time.sleep(0.005)


def reported(call, error: type[Exception], label: str, code: int) -> int | None:
    """``call()``; if it raises ``error``, print "<label>: <error>" and give ``code`` (else None)."""
    try:
        call()
    except error as exc:
        print(f"{label}: {exc}", flush=True)
        return code
    return None


def main() -> int | None:
    mode = sys.argv[1]
    me = popdist.getInstanceIndex()
    if mode == "late":
        if me == 1:
            signal.pause()
        enter_together(Path(sys.argv[2]), me, (0, 2))
    if mode == "leaves":
        return 0 if me == 1 else reported(lambda: C.allreduce(np.ones(3)), RendezvousError, "refused", 6)
    if mode == "stopped":
        C.barrier()
        if me == 1:
            signal.signal(signal.SIGTERM, lambda *_: (print("stopped instance: SIGTERM handled", flush=True),
                                                      os._exit(0)))
            os.kill(os.getpid(), signal.SIGSTOP)
        return reported(lambda: C.allreduce(np.ones(1)), PeerLostError, "lost", 3)
    if mode == "gil":
        C.allreduce(np.ones(1))
        if me == 1:
            import ctypes  # (PyDLL: the call keeps the GIL, as a long C call in a program does)
            ctypes.PyDLL(None).open(sys.argv[2].encode(), os.O_RDONLY)
        print(f"second: {C.allreduce(np.ones(1))[0]}", flush=True)
        return 0
    if mode == "wrong-token" and me == 0:
        os.environ["POPRUN_JOB_TOKEN"] = "0" * 64
        try:
            popdist.init()
        except RendezvousError as exc:
            print(f"refused: {exc}", flush=True)
            return 5
    if mode == "killed":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before init: only the fabric may end a survivor
    popdist.init()
    if mode == "killed":
        C.barrier()  # every instance is in the fabric before instance 1 dies
        if me == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return reported(lambda: C.allreduce(np.ones(1000, np.float32)), PeerLostError, "lost", 3)
    if mode in ("finalized", "exits"):
        C.barrier()
        if me == 1:
            if mode == "finalized":
                popdist.finalizeBackend()
                others = tuple(i for i in range(popdist.getNumInstances()) if i != 1)
                enter_together(Path(sys.argv[2]), me, others)  # alive until the others have raised
            return 0
        code = reported(lambda: C.allreduce(np.ones(1000, np.float32)), PeerLostError, "lost", 3)
        if mode == "finalized":
            (Path(sys.argv[2]) / f"started-{me}").touch()
        return code
    if mode == "mismatch":
        return reported(lambda: C.allreduce(np.ones(3 if me == 0 else 4, np.float32)), CollectiveMismatchError,
                        "mismatch", 4)
    if mode in ("roots", "roots-then"):
        C.broadcast(np.full(4, float(me)), root=0 if me == 0 else 1)
        return reported(C.barrier, CollectiveMismatchError, "mismatch", 4) if mode == "roots-then" else 0
    C.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
