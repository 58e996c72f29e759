"""Allreduce latency and bandwidth of the fabric on this host (a benchmark, not a test).

usage: fabric_bench.py [--instances 2 4] [--transport auto] [--sizes 4096 4194304 67108864]

Starts a rendezvous and N copies of itself as workers; instance 0 prints one
line per size: time per allreduce (median of batches) and the bandwidth as
size / time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

import numpy as np


def worker(sizes: list[int]) -> None:
    from simipu.fabric.connect import connect

    host, port = os.environ["FABRIC_ADDRESS"].rsplit(":", 1)
    instance, n = int(os.environ["FABRIC_INSTANCE"]), int(os.environ["FABRIC_INSTANCES"])
    fabric = connect((host, int(port)), bytes.fromhex(os.environ["FABRIC_TOKEN"]), job_id=os.environ["FABRIC_JOB"],
                     instance=instance, num_instances=n, transport=os.environ["FABRIC_TRANSPORT"])
    with fabric:
        for size in sizes:
            array = np.ones(size // 4, dtype=np.float32)
            iterations = max(5, min(2000, (200 << 20) // size))
            for _ in range(max(2, iterations // 10)):
                fabric.allreduce(array)
            batches = []
            for _ in range(5):
                fabric.barrier()
                start = time.perf_counter()
                for _ in range(iterations):
                    fabric.allreduce(array)
                batches.append((time.perf_counter() - start) / iterations)
            seconds = float(np.median(batches))
            if instance == 0:
                print(json.dumps({"instances": n, "bytes": size, "seconds": seconds}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 4 << 20, 64 << 20])
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.sizes)
        return
    from simipu.fabric.rendezvous import RendezvousServer

    for n in args.instances:
        token = os.urandom(32)
        server = RendezvousServer(n, token)
        server.start()
        env = dict(os.environ, FABRIC_ADDRESS="%s:%d" % server.address, FABRIC_TOKEN=token.hex(),
                   FABRIC_JOB=uuid.uuid4().hex[:12], FABRIC_INSTANCES=str(n), FABRIC_TRANSPORT=args.transport)
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--sizes", *map(str, args.sizes)],
                                  env=dict(env, FABRIC_INSTANCE=str(i)), stdout=subprocess.PIPE, text=True)
                 for i in range(n)]
        try:
            for line in procs[0].stdout:
                r = json.loads(line)
                size, t = r["bytes"], r["seconds"]
                print(f"{args.transport} n={n} {size:>10} B  {t * 1e6:10.1f} us  {size / t / 1e9:7.2f} GB/s")
            for proc in procs:
                proc.wait(timeout=300)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            server.close()


if __name__ == "__main__":
    main()
