"""A large ``Isend`` whose receiver first waits for something else (3 instances), as MPI programs rely on
``Isend`` returning before its receive is posted: rank 0 ``Isend``s rank 1 8 MiB, then tells rank 2 to go,
while rank 1 waits to hear from rank 2 before its ``Recv`` (each wait takes the others' messages meanwhile);
then each rank ``Isend``s 8 MiB to the next, allreduces, and only then receives from the one before; then the
first chain again with rank 1 polling (``iprobe``, then ``test``) instead of waiting (a poll took nothing from
rank 0, whose ``Isend`` stayed stuck: a hang). Each rank prints its results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}
big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: more than a link holds, so the send waits for room
if r == 0:
    request = comm.Isend(big, dest=1, tag=1)
    comm.send("go", dest=2, tag=2)
    request.Wait()
elif r == 2:
    out["heard"] = comm.recv(source=0, tag=2)
    comm.send("go on", dest=1, tag=3)
elif r == 1:
    out["heard"] = comm.recv(source=2, tag=3)
    got = np.empty_like(big)
    comm.Recv(got, source=0, tag=1)
    out["chain"] = bool(np.array_equal(got, big))

mine = np.full(1 << 20, float(r))
request = comm.Isend(mine, dest=(r + 1) % n, tag=7)
out["allreduce"] = comm.allreduce(r)
got = np.empty_like(mine)
comm.Recv(got, source=(r - 1) % n, tag=7)
request.Wait()
out["ring"] = float(got[0]) if np.all(got == got[0]) else None

for poll in ("iprobe", "test"):
    if r == 0:
        request = comm.Isend(big, dest=1, tag=4)
        comm.send("go", dest=2, tag=5)
        request.Wait()
    elif r == 2:
        comm.recv(source=0, tag=5)
        comm.send(f"polled by {poll}", dest=1, tag=6)
    elif r == 1:
        if poll == "iprobe":
            while not comm.iprobe(source=2, tag=6):
                pass
            heard = comm.recv(source=2, tag=6)
        else:
            waiting = comm.irecv(source=2, tag=6)
            while True:
                done, heard = waiting.test()
                if done:
                    break
        got = np.empty_like(big)
        comm.Recv(got, source=0, tag=4)
        out[poll] = [heard, bool(np.array_equal(got, big))]
print(json.dumps(out), flush=True)
