"""mpi4py's semantics over the fabric, each result printed as JSON for the test to check (3 instances)."""

import json
import pickle
import threading

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n, "processor": MPI.Get_processor_name() != ""}
out["bcast"] = comm.bcast({"root": r} if r == 2 else None, root=2)
out["allgather"] = comm.allgather(r * 10)
out["gather"] = comm.gather(f"r{r}", root=1)
out["scatter"] = comm.scatter([[i] * (i + 1) for i in range(n)] if r == 0 else None, root=0)
out["reduce"] = comm.reduce(r + 1, op=MPI.PROD, root=0)
out["allreduce_max"] = comm.allreduce(r, op=MPI.MAX)

if r == 0:
    comm.send({"hello": "from 0"}, dest=2, tag=7)
    out["recv"] = comm.recv(source=2, tag=8)
elif r == 2:
    out["recv"] = comm.recv(source=0, tag=7)
    comm.send([1, 2, 3], dest=0, tag=8)

values = np.array([r + 1, 10 * (r + 1)], dtype=np.float32)
total = np.empty_like(values)
comm.Allreduce(values, total, op=MPI.SUM)
out["Allreduce"] = total.tolist()
smallest = np.zeros(2, dtype=np.float32)
comm.Reduce(values, smallest if r == 1 else None, op=MPI.MIN, root=1)
out["Reduce"] = smallest.tolist()
part = np.empty(2, dtype=np.int64)
comm.Scatter(np.arange(2 * n, dtype=np.int64) if r == 2 else None, part, root=2)
out["Scatter"] = part.tolist()
refused = []  # (a root that is no rank, or that gives the wrong number of parts: every rank says scatter's why)
for scatter in (lambda: comm.scatter([0] * n, root=n), lambda: comm.scatter([0] * (n - 1), root=0),
                lambda: comm.Scatter([np.arange(2 * n, dtype=np.int64), 2], np.zeros(3, np.int64), root=0)):
    try:
        scatter()
    except ValueError as exc:
        refused.append(str(exc))
out["scatter_refused"] = refused
elsewhere: list = []  # (THREAD_SERIALIZED, honestly: the fabric takes one call at a time)
other = threading.Thread(target=lambda: elsewhere.append(MPI.Is_thread_main()))
other.start()
other.join()
out["threads"] = [MPI.Query_thread() == MPI.THREAD_SERIALIZED, MPI.Is_thread_main(), *elsewhere]
if r == 1:
    comm.Send(np.array([4.5, 5.5]), dest=0, tag=3)
elif r == 0:
    received = np.empty(2)
    status = MPI.Status()
    comm.Recv(received, source=1, tag=3, status=status)
    out["Recv"] = [received.tolist(), status.Get_source(), status.Get_tag()]
out["self"] = [MPI.COMM_SELF.Get_size(), MPI.COMM_SELF.allreduce(r + 5)]
try:
    comm.Create_intercomm(0, MPI.COMM_WORLD, 1)
except AttributeError as exc:
    out["missing"] = str(exc)
try:
    MPI.Comm.Compare(comm, MPI.COMM_WORLD)  # (a class attribute: a plain AttributeError before)
except AttributeError as exc:
    out["missing_on_the_class"] = str(exc)
out["hasattr_Win"] = hasattr(MPI, "Win")
try:
    comm.Recv(np.zeros(1), source=99)
except MPI.Exception as exc:  # (an int where one is compared, as mpi4py's: all but int(exc) failed before)
    out["exception"] = [exc == MPI.ERR_RANK, exc != MPI.ERR_RANK, int(exc), exc.error_class, exc.error_code,
                        exc.Get_error_class(), {exc: "rank"}.get(MPI.ERR_RANK), exc.error_string, str(exc),
                        isinstance(pickle.loads(pickle.dumps(exc)), ValueError)]
status = MPI.Status()  # (mpi4py's setters, and the rest of its API named as not provided: AttributeError before)
status.Set_source(2), status.Set_tag(5), status.Set_error(MPI.ERR_TRUNCATE), status.Set_elements(MPI.DOUBLE, 3)
out["status"] = [status.source, status.tag, status.error, status.Get_count(), status.Get_elements(MPI.DOUBLE),
                 status.Is_cancelled(), status.cancelled, MPI.Status(status).Get_count(MPI.INT)]
out["datatypes"] = [MPI.DOUBLE.name, MPI.DOUBLE.Get_name(), MPI.TWOINT.name, MPI.DOUBLE.typechar, MPI.CHAR.typechar,
                    MPI.LONG_LONG.typechar, MPI.DOUBLE_INT.typechar, MPI.Query_thread() == MPI.THREAD_SERIALIZED]
missing = []
for owner, method in ((MPI.DOUBLE, "Create_vector"), (MPI.Datatype, "Create_contiguous"), (status, "tomemory")):
    try:
        getattr(owner, method)
    except MPI.NotProvidedError as exc:
        missing.append(str(exc).split(";")[0])
out["not_provided"] = missing
made = MPI.Exception(MPI.ERR_ARG)
out["made"] = [str(made), int(made), bool(made), bool(MPI.Exception()), made < MPI.ERR_TRUNCATE,
               MPI.ERR_IN_STATUS, MPI.Get_error_string(MPI.ERR_OTHER), pickle.loads(pickle.dumps(made)) == made]
copied = comm.Dup()
comm.Barrier()
MPI.Finalize()  # (then no call on a communicator, nor a second Finalize: all worked before)
finalized: list = []
for call in (lambda: comm.allreduce(1), lambda: copied.Get_rank(), lambda: MPI.COMM_SELF.rank, MPI.Finalize):
    try:
        finalized.append(call())
    except MPI.Exception as exc:
        finalized.append([exc.error_class == MPI.ERR_OTHER, str(exc)])
out["finalized"] = [MPI.Is_finalized(), finalized]
print(json.dumps(out), flush=True)
