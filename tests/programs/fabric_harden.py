"""Fabric set-up under conditions that once broke it (tests/test_fabric_hardening.py).

usage: fabric_harden.py MODE [ARG]
  slow-start SECONDS  instance 1 works SECONDS before popdist.init() (as a program that imports
                      torch or loads data first); then an allreduce
  many-fds COUNT      every instance raises its descriptor limit and opens COUNT descriptors before
                      init(), so the fabric's own sockets number above 1024; prints the highest
                      descriptor number, then allreduces and a barrier; instance 1 works 1 s first
                      so that instance 0 waits in poll (where a loss would be noticed)
  squatted GO_FILE    instance 0 prints its job id and joins; instance 1 waits for GO_FILE first
                      (the test squats the Unix socket name instance 1 would once have used)
Each instance prints "sum <values>" after its allreduce.
"""

import os
import resource
import sys
import time

import numpy as np

import popdist
import popdist.collectives as C


def wait_for(path: str, bound: float = 30.0) -> None:
    """Wait (bounded) for the test to create ``path``: the test decides when this instance may go on."""
    deadline = time.monotonic() + bound
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"{path} never appeared")
        time.sleep(0.01)


def main() -> int:
    mode, arg = sys.argv[1], sys.argv[2]
    me = popdist.getInstanceIndex()
    held = []
    if mode == "slow-start" and me == 1:
        time.sleep(float(arg))  # the behaviour under test: a slow start, longer than --fabric-timeout
    if mode == "many-fds":
        wanted = int(arg) + 256
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(arg))]
    if mode == "squatted":
        if me == 0:
            print(f"job {os.environ['POPRUN_JOB_ID']}", flush=True)
        else:
            wait_for(arg)
    popdist.init()
    if mode == "many-fds":
        print(f"highest fd {max(int(fd) for fd in os.listdir('/proc/self/fd'))}", flush=True)
        if me == 1:
            time.sleep(1)  # the behaviour under test: instance 0 waits in poll, where it reads the loss table
    total = C.allreduce(np.full(4, me + 1, np.float32))
    C.barrier()
    print("sum " + " ".join(f"{v:g}" for v in total), flush=True)
    for fd in held:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
