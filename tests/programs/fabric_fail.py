"""Fabric failure cases under poprun.

usage: fabric_fail.py MODE
  killed      instance 1 SIGKILLs itself as the others enter an allreduce;
              survivors ignore SIGTERM (so only the fabric can end them) and
              print "lost: <error>" when the allreduce raises
  late DIR    instance 1 never joins the fabric; the others wait in init(), which instances 0 and 2
              enter together (each leaves a file in DIR and waits for the other's), so that however
              slowly each process starts, only instance 1 is late
  mismatch    instance 0 reduces 3 floats, the others 4
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


def main() -> int:
    mode = sys.argv[1]
    me = popdist.getInstanceIndex()
    if mode == "late":
        if me == 1:
            signal.pause()
        enter_together(Path(sys.argv[2]), me, (0, 2))
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
        try:
            C.allreduce(np.ones(1000, np.float32))
        except PeerLostError as exc:
            print(f"lost: {exc}", flush=True)
            return 3
    if mode == "mismatch":
        try:
            C.allreduce(np.ones(3 if me == 0 else 4, np.float32))
        except CollectiveMismatchError as exc:
            print(f"mismatch: {exc}", flush=True)
            return 4
    C.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
