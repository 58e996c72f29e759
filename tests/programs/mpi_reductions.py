"""mpi4py's reduction operations beyond the arithmetic four, and the reduce-scatters (3 instances): the
logical and bitwise ones on objects and on buffers, MAXLOC and MINLOC on (value, index) pairs, a user's
``Op.Create`` (not commutative: its results show the rank order), ``Reduce_local``, the types Open MPI
refuses (``MPI.ERR_OP``), ``Reduce_scatter_block`` / ``Reduce_scatter`` blocking, nonblocking and in place.
The expected values are what Open MPI 4.1 with mpi4py 4 gave for this program's calls. Each rank prints its
results as JSON."""

import json

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {"rank": r, "size": n}


def error_of(call):
    try:
        call()
    except MPI.Exception as exc:
        return [exc.Get_error_code() == MPI.ERR_OP, str(exc)]
    except ValueError as exc:  # (mpi4py's, for a freed user operation)
        return [type(exc).__name__, str(exc)]
    return "no error"


def reduced(op, values, dtype):
    result = np.zeros(len(values), dtype)
    comm.Allreduce(np.array(values, dtype), result, op=op)
    return result.tolist()


out["objects"] = [comm.allreduce(r == 1, op=MPI.LOR), comm.allreduce(r, op=MPI.LAND),
                  comm.allreduce(r, op=MPI.LXOR), comm.allreduce(r + 4, op=MPI.BOR),
                  comm.allreduce(r + 5, op=MPI.BAND), comm.allreduce(r + 1, op=MPI.BXOR),
                  comm.allreduce([True, r], op=MPI.LAND)]
out["locations"] = [comm.allreduce((r % 2, r), op=MPI.MAXLOC), comm.allreduce((r % 2, r), op=MPI.MINLOC),
                    comm.allreduce((5, 3 - r), op=MPI.MAXLOC), comm.reduce((r * 1.5, r), op=MPI.MAXLOC, root=1)]
out["buffers"] = [reduced(MPI.LAND, [r, 1, 2], np.int32), reduced(MPI.LOR, [0, r, 3], np.int32),
                  reduced(MPI.LXOR, [0, r, 3], np.int32), reduced(MPI.BAND, [r + 5, 7, 6], np.int32),
                  reduced(MPI.BOR, [r + 4, 1, 2], np.int64), reduced(MPI.BXOR, [r + 1, 1, 2], np.uint8),
                  reduced(MPI.LAND, [True, r == 0, r >= 0], np.bool_), reduced(MPI.LOR, [False, r == 0], np.bool_)]
out["refused"] = [error_of(lambda: reduced(MPI.LAND, [1.0, r], np.float64)),
                  error_of(lambda: reduced(MPI.BOR, [r == 1, False], np.bool_)),
                  error_of(lambda: reduced(MPI.MAXLOC, [r, r], np.int32)),
                  error_of(lambda: reduced(MPI.REPLACE, [r], np.int32)),
                  error_of(lambda: MPI.SUM.Free()),
                  error_of(lambda: reduced(MPI.SUM, [True, False], np.bool_)),
                  error_of(lambda: reduced(MPI.MAX, [1j, r], np.complex64))]
pairs = np.array([(r % 2, r), (float(r), r), (1, 2 - r)], dtype=[("v", "f8"), ("i", "i4")])  # (packed: 12 bytes)
double_int = np.zeros(3, np.dtype([("value", "f8"), ("index", "i4")], align=True))  # (as C lays out DOUBLE_INT)
double_int["value"], double_int["index"] = pairs["v"], pairs["i"]
maxloc = np.zeros_like(double_int)
comm.Allreduce([double_int, MPI.DOUBLE_INT], [maxloc, MPI.DOUBLE_INT], op=MPI.MAXLOC)
minloc = np.zeros(3, [("v", "f4"), ("i", "i4")])  # (a FLOAT_INT array with names of its own)
comm.Allreduce([np.array(pairs.tolist(), minloc.dtype), MPI.FLOAT_INT], [minloc, MPI.FLOAT_INT], op=MPI.MINLOC)
two_ints = np.array([[r % 2, r], [r, r]], np.int32)
comm.Allreduce(MPI.IN_PLACE, [two_ints, MPI.TWOINT], op=MPI.MAXLOC)
nan_pairs = np.array([([2.0, np.nan, 3.0][r], r)], [("v", "f4"), ("i", "i4")])
nan_max, nan_min = np.zeros_like(nan_pairs), np.zeros_like(nan_pairs)
comm.Allreduce([nan_pairs, MPI.FLOAT_INT], [nan_max, MPI.FLOAT_INT], op=MPI.MAXLOC)
comm.Allreduce([nan_pairs, MPI.FLOAT_INT], [nan_min, MPI.FLOAT_INT], op=MPI.MINLOC)
out["nan_pairs"] = [nan_max.tolist(), nan_min.tolist()]
out["pairs"] = [maxloc.tolist(), minloc.tolist(), two_ints.tolist(), MPI.DOUBLE_INT.Get_size(),
                MPI.DOUBLE_INT.Get_extent()[1]]
try:
    comm.Allreduce([pairs, MPI.DOUBLE_INT], [maxloc, MPI.DOUBLE_INT], op=MPI.MAXLOC)
except ValueError as exc:  # (every rank: its 36 bytes are not 16-byte items)
    out["packed_pairs"] = str(exc)


def concatenated(a, b, datatype):
    """A user's operation that does not commute: "(a.b)" of objects; a * 10 + b of int32 buffers."""
    if datatype is None:
        return f"({a}.{b})"
    assert datatype == MPI.INT
    lower, higher = np.frombuffer(a, np.int32), np.frombuffer(b, np.int32)
    higher[:] = lower * 10 + higher


concat = MPI.Op.Create(concatenated, commute=False)
everyone = np.zeros(2, np.int32)
comm.Allreduce(np.array([r, r + 1], np.int32), everyone, op=concat)
prefix = np.zeros(2, np.int32)
comm.Scan(np.array([r, r + 1], np.int32), prefix, op=concat)
local = np.array([1, 2], np.int32)
concat.Reduce_local(np.array([3, 4], np.int32), local)
summed = np.array([10, 20])
MPI.SUM.Reduce_local(np.array([1, 2]), summed)
out["user"] = [comm.allreduce(str(r), op=concat), comm.scan(str(r), op=concat), comm.exscan(str(r), op=concat),
               everyone.tolist(), prefix.tolist(), local.tolist(), summed.tolist(),
               [concat.Is_commutative(), MPI.SUM.Is_commutative(), concat.is_predefined, MPI.SUM.is_predefined]]
request = comm.Iallreduce(np.array([r, r + 1], np.int32), everyone, op=concat)
request.Wait()
out["user_nonblocking"] = everyone.tolist()
concat.Free()
out["freed"] = [concat == MPI.OP_NULL, bool(concat), bool(MPI.OP_NULL),
                error_of(lambda: comm.allreduce(r, op=concat))]

send = np.arange(2 * n, dtype=np.int32) + 100 * r
block = np.zeros(2, np.int32)
comm.Reduce_scatter_block(send, block)
whole = send.copy()
comm.Reduce_scatter_block(MPI.IN_PLACE, whole)
counted_block = np.zeros(2, np.int32)
comm.Reduce_scatter_block([send, 2, MPI.INT], counted_block)  # (a count in a spec is one rank's block)
counted_whole = send.copy()
comm.Reduce_scatter_block(MPI.IN_PLACE, [counted_whole, 2, MPI.INT])
out["counted"] = [counted_block.tolist(), counted_whole.tolist()]
mine = np.zeros(r + 1, np.int32)
comm.Reduce_scatter(np.arange(6, dtype=np.int32) + 100 * r, mine)  # (counts: each rank's receive buffer's)
maxima = np.zeros(r + 1, np.int32)
comm.Reduce_scatter(np.arange(6, dtype=np.int32) + 100 * r, maxima, [1, 2, 3], op=MPI.MAX)
in_place = np.arange(6, dtype=np.int32) + 100 * r
comm.Reduce_scatter(MPI.IN_PLACE, in_place, [1, 2, 3])
ored = np.zeros(2, np.int32)
nonblocking = np.zeros(r + 1, np.int32)
MPI.Request.Waitall([comm.Ireduce_scatter_block(send, ored, op=MPI.BOR),
                     comm.Ireduce_scatter(np.arange(6, dtype=np.int32) + 100 * r, nonblocking, [1, 2, 3])])
out["reduce_scatter"] = [block.tolist(), whole.tolist(), mine.tolist(), maxima.tolist(), in_place.tolist(),
                         ored.tolist(), nonblocking.tolist()]
try:
    comm.Reduce_scatter(np.arange(6, dtype=np.int32), np.zeros(4, np.int32), [1, 2, 3])
except ValueError as exc:
    out["bad_count"] = str(exc)
print(json.dumps(out), flush=True)
