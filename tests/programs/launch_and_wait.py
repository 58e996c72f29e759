"""Calls poprun_py.launch on a function that never returns; each instance prints "instance <i> <pid>".

The test SIGKILLs this process and checks that the instances die anyway (the guardian).
"""

import os
import sys
import time

import popdist
import poprun_py


def wait_forever() -> None:
    print(f"instance {popdist.getInstanceIndex()} {os.getpid()}", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    poprun_py.launch(wait_forever, num_instances=int(sys.argv[1]))
