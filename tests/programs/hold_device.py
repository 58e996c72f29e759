"""An instance that initialises PopDist (taking over its device), says so, then waits.

It opens the FIFO named by HOLD_GO_FIFO (the test holds its write end open),
prints "ready <instance> <pid>", and waits for end-of-file: the test closes
its end to release every instance at once, whatever their timing.
"""

import os

import popdist

popdist.init()
go = os.open(os.environ["HOLD_GO_FIFO"], os.O_RDONLY)
print(f"ready {popdist.getInstanceIndex()} {os.getpid()}", flush=True)
os.read(go, 1)
