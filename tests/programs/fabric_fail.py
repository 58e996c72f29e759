"""Fabric failure cases under poprun.

usage: fabric_fail.py MODE
  killed      instance 1 SIGKILLs itself as the others enter an allreduce;
              survivors ignore SIGTERM (so only the fabric can end them) and
              print "lost: <error>" when the allreduce raises
  late        instance 1 never joins the fabric; the others wait in init()
  mismatch    instance 0 reduces 3 floats, the others 4
  wrong-token instance 0 joins with a token it made up
"""

import os
import signal
import sys

import numpy as np

import popdist
import popdist.collectives as C
from simipu.fabric import CollectiveMismatchError, PeerLostError, RendezvousError


def main() -> int:
    mode = sys.argv[1]
    me = popdist.getInstanceIndex()
    if mode == "late" and me == 1:
        signal.pause()
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
