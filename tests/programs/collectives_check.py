"""Run every collective under poprun and check each result against NumPy.

Inputs are a pure function of the instance (or replica) index, so every
instance can compute the reference itself. Prints one JSON line per instance
with a digest of every result (for determinism checks); raises on a wrong
result, so poprun's exit code tells.
"""

import hashlib
import json
import sys

import numpy as np

import popdist
import popdist.collectives as C
from popdist import replicas

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


def value(index, shape, dtype):
    rng = np.random.default_rng(1000 + index)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 3, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check(name, got, want, digests, exact=True):
    got = np.asarray(got)
    if got.shape != np.shape(want):
        raise AssertionError(f"{name}: shape {got.shape} != {np.shape(want)}")
    if exact or not np.issubdtype(got.dtype, np.floating):
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-2 if got.dtype == np.float16 else 1e-5, atol=1e-3, err_msg=name)
    digests[name] = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()[:16]


def main():
    popdist.init()
    me, n = popdist.getInstanceIndex(), popdist.getNumInstances()
    digests = {}
    shape = (5, 7)
    for dtype in DTYPES:
        inputs = [value(i, shape, dtype) for i in range(n)]
        stacked = np.stack(inputs)
        for op, reduce in REDUCE.items():
            if op == "prod" and np.issubdtype(dtype, np.floating):
                continue  # products of normals under/overflow float16; ints cover prod
            check(f"allreduce-{op}-{np.dtype(dtype).name}", C.allreduce(inputs[me], op),
                  reduce(stacked, axis=0).astype(dtype), digests, exact=op != "sum")
        if np.issubdtype(dtype, np.floating):
            check(f"allreduce-mean-{np.dtype(dtype).name}", C.allreduce(inputs[me], "mean"),
                  stacked.astype(np.float64).mean(axis=0), digests, exact=False)
        for root in range(n):
            check(f"broadcast-{root}-{np.dtype(dtype).name}", C.broadcast(inputs[me], root), inputs[root], digests)
        check(f"allgather-{np.dtype(dtype).name}", C.allgather(inputs[me]), stacked, digests)
        mine, out = inputs[me].copy(), np.empty_like(stacked)
        if C.broadcast(mine, n - 1, out=mine) is not mine or C.allgather(inputs[me], out=out) is not out:
            raise AssertionError("broadcast/allgather with out= returned another array than out")
        check(f"broadcast-out-{np.dtype(dtype).name}", mine, inputs[n - 1], digests)
        check(f"allgather-out-{np.dtype(dtype).name}", out, stacked, digests)
    # zero-size and non-contiguous
    check("allreduce-empty", C.allreduce(np.zeros((0, 3), np.float32)), np.zeros((0, 3), np.float32), digests)
    strided = np.arange(40, dtype=np.float64).reshape(5, 8)[:, ::2] * (me + 1)
    check("allreduce-strided", C.allreduce(strided), np.arange(40.0).reshape(5, 8)[:, ::2] * sum(range(1, n + 1)), digests)
    # reduce_scatter: n equal parts along axis 0
    big = np.stack([value(i, (2 * n, 3), np.float64) for i in range(n)])
    check("own-reduce_scatter", C.reduce_scatter(big[me]), big.sum(axis=0)[2 * me : 2 * me + 2], digests, exact=False)
    C.barrier()
    popdist.synchronize()
    # the Horovod tutorial: [1, 0] * index, grouped, Average
    (avg,) = C.grouped_allreduce([np.array([1.0, 0.0]) * me], op=C.Average)
    check("horovod-tutorial", avg, np.array([1.0, 0.0]) * (n - 1) / 2, digests, exact=False)
    # a collective among a subset only
    subset = set(range(0, n, 2))
    result = popdist.execute_on_instances(subset, C.allreduce, np.array([me], np.int64))
    if me in subset:
        check("own-subset-allreduce", result, np.array([sum(subset)]), digests)
    elif result is not None:
        raise AssertionError("execute_on_instances ran where it should not")
    # replica level: every replica of every instance
    total = popdist.getNumTotalReplicas()

    def program(replica):
        x = value(100 + replica.index, (4,), np.float32)
        everyone = np.stack([value(100 + r, (4,), np.float32) for r in range(total)])
        check(f"replica-sum-{replica.index}", replica.cross_replica_sum(x), everyone.sum(axis=0), {}, exact=False)
        check(f"replica-max-{replica.index}", replica.cross_replica_max(x), everyone.max(axis=0), {})
        check(f"replica-gather-{replica.index}", replica.cross_replica_allgather(x), everyone, {})
        check(f"replica-bcast-{replica.index}", replica.cross_replica_broadcast(x, root=total - 1), everyone[-1], {})
        return replica.index, hashlib.sha256(replica.cross_replica_sum(x).tobytes()).hexdigest()[:16]

    for index, digest in replicas.run(program):
        digests[f"own-replica-{index}"] = digest
    print(json.dumps({"instance": me, "digests": digests}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
