"""``popdist.collectives.allreduce_init`` under poprun, against the plain ``allreduce``.

Modes (argv[1]):
  results   for each case (dtype, shape, op; the board, shared-memory and socket paths; a group of the first
            and last instances), bind an array, change it in place between calls (instance 0 late for one; its
            shape too, at the end), and check that each persistent call gives the plain call's result bit for
            bit, in the same output array every time; prints one JSON line with a digest of each case's last
            result
  mismatch  instance 0 binds 3 floats, the others 4: every instance prints "mismatch: <error>" and exits 4
  misuse    arrays that cannot be bound: prints "refused: <error>" for each
"""

import hashlib
import json
import signal
import sys
import time

import numpy as np

import popdist
import popdist.collectives as C
from simipu.fabric import CollectiveMismatchError

CASES = [  # (dtype, shape, op)
    (np.float32, (1024,), "sum"),  # 4 KiB: the board
    (np.float32, (2, 3), "mean"),
    (np.float64, (), "max"),  # 0-d
    (np.int32, (7,), "prod"),
    (np.float16, (33,), "min"),
    (np.float32, (64 * 1024,), "sum"),  # 256 KiB: shared memory (sockets with tcp)
    (np.float64, (128, 256), "mean"),  # 256 KiB too, 2-d, divided after the sum
    (np.int32, (40_000,), "max"),  # 160 KiB
    (np.float32, (70_000,), "sum"),  # beyond a board (over 64 KiB)
]


def value(rank, call, shape, dtype):
    rng = np.random.default_rng(100 * rank + call)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(1, 3, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check_case(me, dtype, shape, op):
    bound = np.zeros(shape, dtype)
    call = C.allreduce_init(bound, op=op)
    outputs = set()
    for k in range(4):  # the bound array's contents change in place; each call reduces the current ones
        bound[...] = value(me, k, shape, dtype)
        if k == 2 and me == 0:
            time.sleep(0.05)  # (not to synchronise: so that the peers' fast paths give up waiting and fall back)
        want = C.allreduce(bound, op)  # the plain call in between: the same frames, the same sequence
        got = call()
        outputs.add(id(got))
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            raise AssertionError(f"{np.dtype(dtype)}{list(shape)} {op}, call {k}: {got!r} != {want!r}")
    if len(outputs) != 1:
        raise AssertionError("a persistent call returned different arrays")
    bound.shape = (*shape, 1)  # in place, on every instance: the call keeps the bound memory's bound shape
    bound[...] = value(me, 4, bound.shape, dtype)
    want, got = C.allreduce(bound.reshape(shape), op), call()
    if got.shape != shape or got.tobytes() != want.tobytes() or id(got) not in outputs:
        raise AssertionError(f"{np.dtype(dtype)}{list(shape)} {op}, after an in-place reshape: {got!r} != {want!r}")
    return hashlib.sha256(got.tobytes()).hexdigest()


def results(me):
    digests = {f"{np.dtype(d)}{list(s)}-{op}": check_case(me, d, s, op) for d, s, op in CASES}
    pair = C.execute_on_instances({0, C.size() - 1}, check_case, me, np.float32, (16,), "sum")
    print(json.dumps({"instance": me, "digests": digests, "pair": pair}), flush=True)
    return 0


def mismatch(me):
    # poprun stops the others once the first instance exits: SIGTERM, then SIGKILL after --stop-grace. An
    # instance that has not yet been scheduled to see the mismatch would die of the SIGTERM unseen, so the
    # test could not tell that it raises too; with SIGTERM ignored, it reports, then exits (or is killed).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    call = C.allreduce_init(np.ones(3 if me == 0 else 4, np.float32))
    try:
        call()
    except CollectiveMismatchError as exc:
        print(f"mismatch: {exc}", flush=True)
        return 4
    return 0


def misuse(me):
    for bad in ([1.0, 2.0], np.ones((4, 4), np.float32)[:, 0], np.ones(4, ">f4"), np.array(["a"])):
        try:
            C.allreduce_init(bad)
        except (TypeError, ValueError) as exc:
            print(f"refused: {exc}", flush=True)
    C.barrier()
    return 0


def main():
    popdist.init()
    return {"results": results, "mismatch": mismatch, "misuse": misuse}[sys.argv[1]](C.rank())


if __name__ == "__main__":
    sys.exit(main())
