"""mpi4py's nonblocking collectives (3 instances or more), as MPI programs use them: the sparse exchange that
needs them (``Issend``s, then an ``Ibarrier`` tested while receiving whatever comes), an ``Iallreduce`` left
running across point-to-point messages, a rank that sends after its ``Ibarrier`` to one that receives before
its own, every kind posted together and completed by one ``Waitall``, ``Get_status``, and ``MPI.IN_PLACE``
(in the all-to-alls too). Each rank prints its results as JSON. With the argument ``mismatch``, rank 0 calls
``Ibarrier`` while the others call ``Iallreduce``."""

import json
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
if sys.argv[1:] == ["mismatch"]:
    if r == 0:
        comm.Ibarrier().Wait()
    else:
        comm.Iallreduce(np.ones(1), np.zeros(1)).Wait()
    sys.exit(0)
out = {"rank": r, "size": n}

# the sparse exchange (NBX): each rank knows whom it sends to, not who sends to it
sends = [comm.issend(f"from {r}", dest=(r + hop) % n, tag=5) for hop in (1, 2)]
barrier, heard, status = None, [], MPI.Status()
while True:
    if comm.iprobe(source=MPI.ANY_SOURCE, tag=5, status=status):
        heard.append(comm.recv(source=status.Get_source(), tag=5))
    if barrier is None:
        if MPI.Request.Testall(sends):
            barrier = comm.Ibarrier()
    elif barrier.Test():
        break
out["nbx"] = sorted(heard)

# an Iallreduce left running while the ranks pass messages around a ring
total = np.zeros(2)
running = comm.Iallreduce(np.array([r, 1.0]), total, op=MPI.SUM)
comm.send(r, dest=(r + 1) % n, tag=6)
out["ring"] = comm.recv(source=(r - 1) % n, tag=6)
running.Wait()
out["iallreduce"] = total.tolist()

# rank 0 sends after its Ibarrier; rank 1 receives it before its own (an Ibarrier that waited would hang)
if r == 0:
    first = comm.Ibarrier()
    comm.send("after my Ibarrier", dest=1, tag=7)
    first.Wait()
elif r == 1:
    out["before_ibarrier"] = comm.recv(source=0, tag=7)
    comm.Ibarrier().Wait()
else:
    comm.Ibarrier().Wait()

# Get_status says complete only with the receive buffer filled (it said so before the buffer was)
probed = np.zeros(3)
pending = comm.Iallreduce(np.ones(3), probed)
while not pending.Get_status():
    pass
out["get_status_filled"] = probed.tolist()
pending.Wait()

# MPI.IN_PLACE in the all-to-alls (None means it too, as in mpi4py), and the root's in Scatter
swapped = np.arange(n, dtype=np.float64) + 10 * r
comm.Ialltoall(MPI.IN_PLACE, swapped).Wait()
blocking = np.arange(n, dtype=np.float64) + 10 * r
comm.Alltoall(None, blocking)
varied = np.arange(n, dtype=np.float64) + 10 * r
comm.Alltoallv(MPI.IN_PLACE, [varied, [1] * n])
kept = np.array([-1.0])
comm.Scatter(np.arange(n, dtype=np.float64) if r == 0 else None, MPI.IN_PLACE if r == 0 else kept, root=0)
try:
    comm.Bcast(MPI.IN_PLACE, root=0)
    not_a_buffer = None
except MPI.Exception as exc:
    not_a_buffer = exc.Get_error_class() == MPI.ERR_ARG
out["in_place"] = [swapped.tolist(), blocking.tolist(), varied.tolist(), kept.tolist(), not_a_buffer]

# the prefix reductions and the vector calls (rank k's block holds k + 1 items)
mine = np.full(r + 1, float(r))
counts = [k + 1 for k in range(n)]
prefix, before = np.zeros(1), np.full(1, -1.0)
packed = np.full(sum(counts), -1.0)
to_one = np.full(sum(counts), -1.0) if r == 1 else None
part = np.full(r + 1, -1.0)
swapped = np.full(n * (r + 1), -1.0)  # from each rank k: r + 1 items of value 10k + r
MPI.Request.Waitall([
    comm.Iscan(np.array([r + 1.0]), prefix),
    comm.Iexscan(np.array([r + 1.0]), before, op=MPI.PROD),
    comm.Iallgatherv(mine, [packed, counts]),
    comm.Igatherv(mine, [to_one, counts] if r == 1 else None, root=1),
    comm.Iscatterv([np.arange(sum(counts), dtype=np.float64), counts] if r == 2 else None, part, root=2),
    comm.Ialltoallv([np.concatenate([np.full(k + 1, 10.0 * r + k) for k in range(n)]), [k + 1 for k in range(n)]],
                    [swapped, [r + 1] * n])])
out["prefix_and_vectors"] = [prefix.tolist(), before.tolist(), packed.tolist(),
                             None if to_one is None else to_one.tolist(), part.tolist(), swapped.tolist()]

# every kind at once, completed together
bcast = np.full(3, float(r))
gathered_all = np.zeros(2 * n)
gathered = np.zeros(n) if r == 2 else None
scattered = np.zeros(1)
reduced = np.zeros(1)
exchanged = np.zeros(n)
in_place = np.array([float(r + 1)])
requests = [comm.Ibcast(bcast, root=1),
            comm.Iallgather(np.array([r, r + 0.5]), gathered_all),
            comm.Igather(np.array([float(r * r)]), gathered, root=2),
            comm.Iscatter(np.arange(n, dtype=np.float64) * 10 if r == 0 else None, scattered, root=0),
            comm.Ireduce(np.array([float(r)]), reduced if r == 1 else None, op=MPI.MAX, root=1),
            comm.Ialltoall(np.arange(n, dtype=np.float64) + 100 * r, exchanged),
            comm.Iallreduce(MPI.IN_PLACE, in_place, op=MPI.PROD)]
MPI.Request.Waitall(requests)
out["all_kinds"] = [bcast.tolist(), gathered_all.tolist(), None if gathered is None else gathered.tolist(),
                    scattered.tolist(), reduced.tolist() if r == 1 else None, exchanged.tolist(), in_place.tolist(),
                    all(not request for request in requests)]
comm.Barrier()
print(json.dumps(out), flush=True)
