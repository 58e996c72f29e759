"""mpi4py's nonblocking point to point and ANY_SOURCE, as MPI programs use them, each result printed as JSON
for the test to check (3 instances): a master gathering results from any worker, a halo exchange with
``Isend``/``Irecv`` and ``Waitall``, receives matched in the order they were posted, ``test`` before the
message has come, ``probe``/``iprobe``, ``sendrecv``, ``waitany``, a truncating ``Irecv``, and rings of 8 MiB messages
(``Sendrecv``; ``Irecv``, ``Isend`` and ``Waitall``), large messages received straight into the
buffers of the receives they match, and synchronous sends (``issend``, ``Ssend``, ``Issend``)."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}

# a master takes each worker's result as it comes, from whichever worker
if r == 0:
    status, results = MPI.Status(), {}
    for _ in range(n - 1):
        value = comm.recv(source=MPI.ANY_SOURCE, tag=1, status=status)
        results[status.Get_source()] = value
    out["master"] = {str(k): v for k, v in sorted(results.items())}
else:
    comm.send(r * r, dest=0, tag=1)

# a halo exchange: receives posted first, then the sends, then one wait for all
left, right = (r - 1) % n, (r + 1) % n
halo = np.full(2, -1.0)
requests = [comm.Irecv(halo[0:1], source=left, tag=2), comm.Irecv(halo[1:2], source=right, tag=2),
            comm.Isend(np.array([float(r)]), dest=right, tag=2), comm.Isend(np.array([float(r)]), dest=left, tag=2)]
MPI.Request.Waitall(requests)
out["halo"] = halo.tolist()

# two receives from the same source: the first posted takes the first message, whichever is waited first
if r == 1:
    first, second = comm.irecv(source=0, tag=MPI.ANY_TAG), comm.irecv(source=0, tag=MPI.ANY_TAG)
    out["posted_order"] = [second.wait(), first.wait()]
elif r == 0:
    comm.send("first", dest=1, tag=3)
    comm.send("second", dest=1, tag=4)

# test() before the message can have come (it is sent after the barrier), then until it has
if r == 2:
    request = comm.irecv(source=0, tag=5)
    out["test_before"] = list(request.test())
comm.Barrier()
if r == 0:
    comm.send({"late": True}, dest=2, tag=5)
elif r == 2:
    done, value = request.test()
    while not done:
        done, value = request.test()
    out["test_after"] = value
    out["test_again"] = list(request.test())  # (a completed request is null: nothing more)

# probe, then the receive it saw
if r == 0:
    comm.Send(np.arange(6, dtype=np.int32), dest=2, tag=6)
elif r == 2:
    status = MPI.Status()
    comm.Probe(source=MPI.ANY_SOURCE, tag=6, status=status)
    buffer = np.zeros(status.Get_count(MPI.INT), np.int32)
    out["probe"] = [status.Get_source(), status.Get_count(MPI.INT), comm.iprobe(source=0, tag=7)]
    comm.Recv(buffer, source=status.Get_source(), tag=6)
    out["probed"] = buffer.tolist()

# sendrecv around the ring
out["sendrecv"] = comm.sendrecv(r, dest=right, sendtag=8, source=left, recvtag=8)

# waitany: the one that has come is the one returned
if r == 0:
    requests = [comm.irecv(source=1, tag=9), comm.irecv(source=2, tag=9)]
    comm.send("go", dest=2, tag=10)
    index, value = MPI.Request.waitany(requests)
    out["waitany"] = [index, value, requests[1 - index].wait()]
elif r == 2:
    comm.recv(source=0, tag=10)
    comm.send("from two", dest=0, tag=9)
    comm.recv(source=1, tag=11)
    comm.send("from two, second", dest=0, tag=9)  # (unmatched by rank 0: received below)
elif r == 1:
    comm.send("from one", dest=0, tag=9)  # (may come before or after rank 2's: waitany takes the first matched)
    comm.send("unblock", dest=2, tag=11)
if r == 0:
    out["after_waitany"] = comm.recv(source=2, tag=9)

# an Irecv whose buffer is too small: the error comes at its Wait, and is MPI's
if r == 1:
    comm.Send(np.arange(4, dtype=np.float64), dest=0, tag=12)
elif r == 0:
    request = comm.Irecv(np.zeros(2), source=1, tag=12)
    try:
        request.Wait()
    except MPI.Exception as exc:
        out["truncated"] = exc.Get_error_class() == MPI.ERR_TRUNCATE
# messages of no bytes, and at the edge of travelling in one fabric message with their envelope (64 KiB)
if r == 0:
    for nbytes in (0, 65536, 65537):
        comm.Send(np.arange(nbytes, dtype=np.uint8), dest=1, tag=31)
elif r == 1:
    edges, status = [], MPI.Status()
    for nbytes in (0, 65536, 65537):
        got = np.zeros(65537, np.uint8)
        comm.Recv(got, source=0, tag=31, status=status)
        edges.append(status.Get_count() == nbytes and bool(np.array_equal(got[:nbytes], np.arange(nbytes, dtype=np.uint8))))
    out["edges"] = edges

# ANY_SOURCE takes the sources in turn: rank 1's five messages do not keep rank 2's one waiting to the end
if r == 1:
    for k in range(5):
        comm.send(k, dest=0, tag=30)
elif r == 2:
    comm.send("two", dest=0, tag=30)
comm.Barrier()  # (rank 0's barrier sets all six aside: every one has come before the first receive)
if r == 0:
    status, order = MPI.Status(), []
    for _ in range(6):
        comm.recv(source=MPI.ANY_SOURCE, tag=30, status=status)
        order.append(status.Get_source())
    out["in_turn"] = order

# rings of messages larger than a link holds: each rank's send waits for room while the rank after it waits
# for room too; each takes every peer's messages meanwhile, so the ring turns
big = np.full(1 << 20, float(r))  # 8 MiB
ring = np.empty_like(big)
comm.Sendrecv(big, dest=right, recvbuf=ring, source=left)
out["big_sendrecv"] = [float(ring[0]), float(ring[-1])]
ring[:] = -1
MPI.Request.Waitall([comm.Irecv(ring, source=left, tag=13), comm.Isend(big, dest=right, tag=13)])
out["big_isend"] = [float(ring[0]), float(ring[-1])]

# large messages received straight into the buffer of the receive they match: two Irecvs from rank 0 posted in
# the reverse of the order their tags are sent in, an ANY_TAG one after them, one too small (truncated)
if r == 0:
    for tag, value in ((41, 1.0), (42, 2.0), (43, 3.0), (44, 4.0)):
        comm.Send(np.full(1 << 15, value), dest=1, tag=tag)  # 256 KiB each
elif r == 1:
    second, first, anything = np.zeros(1 << 15), np.zeros(1 << 15), np.zeros((1 << 15) + 8)
    requests = [comm.Irecv(second, source=0, tag=42), comm.Irecv(first, source=0, tag=41),
                comm.Irecv(anything, source=0, tag=MPI.ANY_TAG)]
    MPI.Request.Waitall(requests)
    small = np.zeros(16)
    try:
        comm.Recv(small, source=0, tag=44)
        truncated = False
    except MPI.Exception as exc:
        truncated = exc.Get_error_class() == MPI.ERR_TRUNCATE
    out["placed"] = [sorted(set(first.tolist())), sorted(set(second.tolist())),
                     sorted(set(anything[:1 << 15].tolist())), anything[-8:].tolist(), truncated]

# large pickled objects, each received into the blocking receive's scratch buffer (grown, then reused) and
# unpickled before the next; an irecv's message beside them keeps its own bytes
if r == 0:
    for tag, count in ((51, 1 << 15), (52, 1 << 17), (53, 1 << 14), (54, 1 << 16)):
        comm.send({"tag": tag, "array": np.full(count, float(tag))}, dest=2, tag=tag)
elif r == 2:
    later = comm.irecv(source=0, tag=53)
    got = [comm.recv(source=0, tag=tag) for tag in (51, 52, 54)] + [later.wait()]
    out["scratch"] = [[g["tag"], g["array"].size, sorted(set(g["array"].tolist()))] for g in got]
# synchronous sends: an issend's request completes only once the receiver has matched its message (rank 1
# receives it only after rank 0's Test); an Ssend of a large buffer; an issend to ourselves
if r == 0:
    pending = comm.issend("synchronous", dest=1, tag=61)
    before = pending.Test()
    comm.send("now receive it", dest=1, tag=62)
    pending.Wait()
    comm.Ssend(np.full(1 << 15, 63.0), dest=1, tag=63)
    to_self = comm.Issend(np.array([64.0]), dest=0, tag=64)
    self_before = to_self.Test()
    into = np.zeros(1)
    comm.Recv(into, source=0, tag=64)
    out["synchronous"] = [before, self_before, to_self.Test(), float(into[0])]
    try:
        comm.send("too high", dest=1, tag=1 << 31)
    except MPI.Exception as exc:
        out["tag_too_high"] = exc.Get_error_class() == MPI.ERR_TAG
elif r == 1:
    first = comm.recv(source=0, tag=62)
    big = np.zeros(1 << 15)
    out["synchronous"] = [first, comm.recv(source=0, tag=61)]
    comm.Recv(big, source=0, tag=63)
    out["synchronous"].append(sorted(set(big.tolist())))
# a ring of issends, each rank waiting on its own send's request before its receive's: the wait takes the
# message for the receive posted meanwhile (MPI's progress), so every send is matched (it hung at 3 ranks)
ring_in = comm.irecv(source=(r - 1) % n, tag=65)
ring_out = comm.issend(f"ring from {r}", dest=(r + 1) % n, tag=65)
out["issend_ring"] = MPI.Request.waitall([ring_out, ring_in])[1]
comm.Barrier()
print(json.dumps(out), flush=True)
