"""A master takes its workers' results from any source after every worker has sent its result and exited (no
barrier at the end, as many MPI programs end): the messages are still there (3 instances)."""

import os
import select

from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
if r:
    comm.send(os.getpid(), dest=0, tag=1)
    comm.send(r * 100, dest=0, tag=2)
else:
    pids = [comm.recv(source=worker, tag=1) for worker in range(1, n)]
    for pid in pids:  # (the workers exit at once after their two sends; poprun reaps them at the end, so
        # they stay zombies meanwhile: a pidfd is readable from the exit on)
        poller = select.poll()
        poller.register(os.pidfd_open(pid), select.POLLIN)
        assert poller.poll(30_000), f"worker {pid} did not exit"
    status, results = MPI.Status(), []
    for _ in range(1, n):
        value = comm.recv(source=MPI.ANY_SOURCE, tag=2, status=status)
        results.append((status.Get_source(), value))
    print(sorted(results), flush=True)
