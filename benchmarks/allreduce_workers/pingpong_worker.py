"""Ping-pong between ranks 0 and 1 with mpi4py's point to point, as a program writes it: ``from mpi4py import
MPI`` is poprun-py's under poprun and Open MPI's under mpirun, so one file serves both.

Each size: ``obj`` is ``comm.send``/``comm.recv`` of a small int (pickled, as most mpi4py programs send);
``objN`` of a float64 NumPy array of N bytes (pickled too); a number is ``comm.Send``/``comm.Recv`` of that
many bytes (a uint8 buffer). Rank 1 sends back what it got, plus one (its first element, for an array or a
buffer), and rank 0 checks every reply. After ``warmup`` untimed round
trips, ``blocks`` blocks of ``per_block`` round trips are timed, each block alone: its one-way latency is
half its mean round trip. Rank 0 writes the JSON; other ranks, if any, wait in a barrier.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

PING, PONG = 1, 2


def exchanges(comm: MPI.Comm, rank: int, size: str, problems: list[str]) -> Callable[[int], None]:
    """One round trip number ``k`` of ``size``, as rank ``rank`` plays it (ranks above 1 do nothing)."""
    if size == "obj":
        def objects(k: int) -> None:
            if rank == 0:
                comm.send(k, dest=1, tag=PING)
                back = comm.recv(source=1, tag=PONG)
                if back != k + 1 and len(problems) < 5:
                    problems.append(f"round trip {k}: got {back!r}, want {k + 1}")
            elif rank == 1:
                comm.send(comm.recv(source=0, tag=PING) + 1, dest=0, tag=PONG)
        return objects
    if size.startswith("obj"):
        array = np.zeros(int(size[3:]) // 8)

        def arrays(k: int) -> None:
            if rank == 0:
                array[0] = k
                comm.send(array, dest=1, tag=PING)
                back = comm.recv(source=1, tag=PONG)
                if (back.shape != array.shape or back[0] != k + 1) and len(problems) < 5:
                    problems.append(f"round trip {k}: got {back.shape} first {back[0]}, want {array.shape} {k + 1}")
            elif rank == 1:
                got = comm.recv(source=0, tag=PING)
                got[0] += 1
                comm.send(got, dest=0, tag=PONG)
        return arrays
    out = np.zeros(int(size), np.uint8)
    back = np.zeros_like(out)

    def buffers(k: int) -> None:
        if rank == 0:
            out[0] = k % 256
            comm.Send(out, dest=1, tag=PING)
            comm.Recv(back, source=1, tag=PONG)
            if back[0] != (k + 1) % 256 and len(problems) < 5:
                problems.append(f"round trip {k}: first byte {int(back[0])}, want {(k + 1) % 256}")
        elif rank == 1:
            comm.Recv(back, source=0, tag=PING)
            back[0] = (int(back[0]) + 1) % 256
            comm.Send(back, dest=0, tag=PONG)
    return buffers


def one_size(comm: MPI.Comm, rank: int, size: str, warmup: int, blocks: int, per_block: int) -> dict:
    problems: list[str] = []
    exchange = exchanges(comm, rank, size, problems)
    for k in range(warmup):
        exchange(k)
    comm.Barrier()
    clock = time.perf_counter
    one_way_us = []
    for b in range(blocks):
        start = clock()
        for k in range(b * per_block, (b + 1) * per_block):
            exchange(k)
        one_way_us.append(round((clock() - start) / per_block / 2 * 1e6, 3))
    comm.Barrier()
    return {"size": size, "one_way_us": one_way_us, "problems": problems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="obj,obj1048576,8,4096,65536,1048576",
                        help="comma-separated: obj, objBYTES (an array), or bytes")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--per-block", type=int, default=100)
    parser.add_argument("--out", required=True, help="JSON written by rank 0")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    sizes = [one_size(comm, rank, size, args.warmup, args.blocks, args.per_block) for size in args.sizes.split(",")]
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"n": comm.Get_size(), "library": MPI.Get_library_version().splitlines()[0], "sizes": sizes}, f)


if __name__ == "__main__":
    main()
