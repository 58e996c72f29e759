"""Programs written for Horovod and mpi4py, run unchanged through the real poprun (README "Running Graphcore's
programs"): their imports resolve to popdist.horovod / popdist.mpi4py, the results are the job's, and a real
MPI that would make each instance a world of its own stops the program instead."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from support import PROGRAMS, RUN_TIMEOUT, python_example, python_program, run_poprun

torch = pytest.importorskip("torch", reason="torch's CPU build (README, Dependencies; scripts/test.sh installs it)")

OFFLINE = ("--offline-mode=yes",)
STAND_IN = PROGRAMS / "stand_ins"  # packages named mpi4py and horovod whose world is one process, as the real ones'


def job(instances: int) -> tuple[str, ...]:
    return (*OFFLINE, "--num-instances", str(instances), "--num-replicas", str(instances))


def lines_of(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    assert result.returncode == 0, result.stderr.decode()
    return sorted(result.stdout.decode().splitlines())


def records(result: subprocess.CompletedProcess[bytes]) -> dict[int, dict]:
    found = [json.loads(line) for line in lines_of(result) if line.startswith("{") and '"size"' in line]
    return {record["rank"]: record for record in found}


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def outside_poprun(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_"))} | extra


# -- Horovod ------------------------------------------------------------------------------------------------
def test_hello_horovod_averages_float32_and_float16_on_every_instance() -> None:
    result = run_poprun(*job(4), *python_program("hello_horovod.py"))
    assert lines_of(result) == [
        f"instance {i} of 4: x = tensor([1.5000, 0.0000]) y = tensor([0.0000, 1.5000], dtype=torch.float16)"
        for i in range(4)]


def test_host_benchmark_reports_the_slowest_time_and_the_total_samples() -> None:
    result = run_poprun(*job(3), *python_program("host_benchmark.py"))
    assert lines_of(result) == [f"rank {r}: slowest 3.5 s, total 600 samples (torch.int64)" for r in range(3)]


def test_horovod_semantics_over_three_instances() -> None:
    result = run_poprun(*job(3), *python_program("horovod_semantics.py"))
    by_rank = records(result)
    assert sorted(by_rank) == [0, 1, 2]
    for r, out in by_rank.items():
        assert out["size"] == 3 and out["local"] == [r, 3] and out["cross"] == [0, 1]
        assert out["average"] == [2.0, 2.0] and out["sum"] == [6.0, 6.0] and out["average_false"] == [6.0, 6.0]
        assert out["min_max_product"] == [[1.0, 0.0], [3.0, 4.0], [6.0, 0.0]]
        assert out["bfloat16"] == ["torch.bfloat16", [6.0, 6.0]] and out["int_average"] == [2]
        assert out["fp16_compression"] == ["torch.float32"]  # compressed on the way, the input's dtype back
        assert out["inplace"] == [True, [6.0, 6.0]] and out["scaled"] == [6.0, 6.0]
        assert out["inplace_seen"] is True  # (``allreduce_`` writes the tensor's memory, and tells autograd so)
        assert out["broadcast_parameter"] == [[1.0, 2.0], True, True]
        assert out["grad"] == [6.0]  # the gradient of a Sum allreduce is the Sum allreduce of the gradients
        assert out["allgather"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
        assert out["broadcast"] == [10.0] and out["broadcast_"] == [20.0]
        # Horovod's since 0.22: the average of the gradients (the sum, 3.0, was 0.21's and n times too large)
        assert out["allgather_grad"] == [[1.0, 1.0]] * (r + 1)
        assert out["broadcast_grad"] == ([1.0] if r == 1 else [0.0])
        assert out["object"] == {"from": 1, "list": [1, 1]} and out["objects"] == [["rank", k] for k in range(3)]
        assert out["int_average_scaled"] == [3]  # Horovod scales the sum once: 5 * 2/3, not 5 // 3 * 2
        assert out["synchronize_twice"] == [[6.0, 6.0], None]
        third = float(torch.tensor(1.0) - torch.tensor(1.0) / 3)  # (in float32)
        rows = [[third] * 2] * 3 + [[1.0, 1.0]]  # each rank's row: its gradient 1, averaged over 3
        assert out["sparse_as_dense_False"] == rows and out["sparse_as_dense_True"] == rows
        if importlib.util.find_spec("cloudpickle") is None:
            assert out["lambdas"].startswith("PicklingError: Can't pickle <function <lambda>")
            assert "pip install cloudpickle" in out["lambdas"]
        else:
            assert out["lambdas"] == [2, 2, 2]
        assert out["optimizer_class"] == ["SGD", True] and out["weights_everywhere_equal"] is True
        first, adasum, root = out["errors"]
        assert first.startswith("ValueError") and "not both" in first
        assert adasum.startswith("NotImplementedError: hvd.Adasum is not provided")
        assert root == "ValueError: root_rank=3 is not a rank of this job (0 to 2)"
        assert out["missing"].startswith("horovod.torch.join is not provided by poprun-py's Horovod; see README")
        assert out["root_mismatch"] == ("broadcast: mismatched root ranks: instances named [0, 1, 0], in rank "
                                        "order; every one must name the same root_rank")
    assert '{"rank": 0, "initialized_after_shutdown": false}' in lines_of(result)


def test_a_repeated_horovod_allreduce_calls_the_fabrics_plan_itself() -> None:
    """``hvd.allreduce`` of a float32 CPU tensor, called again, goes to the plan as ``popdist.collectives`` does:
    before, it entered ``Fabric.allreduce`` (engine.py) and ``is_initialized`` too, a fifth of its gap to the
    plain call at 256 KiB; the results stay right."""
    by_rank = records(run_poprun(*job(2), *python_program("horovod_hot_calls.py")))
    assert sorted(by_rank) == [0, 1]
    for out in by_rank.values():
        assert out["wrong"] == [], out
        assert out["frames"]["4096"][:2] == ["mpi_ops.py:allreduce", "board.py:call"], out
        assert out["frames"]["262144"][:2] == ["mpi_ops.py:allreduce", "steady_calls.py:allreduce"], out


def test_horovod_corners_behave_as_horovod_0_28() -> None:
    """Each of these differed from Horovod before: a scheduler made first skipped the reduction (the weights
    drifted apart), bare parameters were unpacked as pairs, a fresh optimizer's state stayed empty, SparseAdam
    refused the dense gradient, mpi_ops had no Average, float16 scaled by a rounded factor, duplicate or
    missing names passed, the allgather mismatch was a ValueError, and the names below were missing. Allreduces
    whose scale factors, dtype (bfloat16 against float32) or op (an integer Average) differ gave each rank its
    own result, with exit 0; an allgather of 0-d tensors gave shape (size,)."""
    import numpy as np

    by_rank = records(run_poprun(*job(2), *python_program("horovod_corners.py")))
    assert sorted(by_rank) == [0, 1]
    expected_half = (np.array([-99, -69, 65], np.float16).astype(np.float32)
                     * np.float32(0.19151945)).astype(np.float16).tolist()
    for out in by_rank.values():
        assert out["imported"] == [0, 1, True, True]
        assert out["parameters_broadcast"] is True and out["scheduler_first"] == [True, 0.05]
        assert out["fresh_state"] == [[1, 1], [0.0, 0.0], True]
        assert out["sparse_adam"] is True
        assert out["fp16_prescale"] == expected_half
        checks, passes, warned = out["optimizer_api"]
        assert checks == ["named_parameters must name each parameter once", "named_parameters was given but "
                          "leaves 1 of the optimizer's parameters unnamed"]
        assert passes == 3 and warned == ["optimizer.step() after optimizer.synchronize() reduces the gradients "
                                          "again"]
        assert out["allgather_mismatch"] == ["RowsMismatchError", True]
        assert out["allgather_0d"] == [
            "allgather: members [0, 1] pass a 0-d array (a rank-zero tensor, which Horovod's allgather refuses too), "
            "and it concatenates on the first dimension: give every member's at least one dimension (x.reshape(1))",
            "allgather: members [0] pass a 0-d array (a rank-zero tensor, which Horovod's allgather refuses too), "
            "and it concatenates on the first dimension: give every member's at least one dimension (x.reshape(1))"]
        assert out["allreduce_mismatch"] == [
            "hvd.allreduce: Mismatched prescale and/or postscale factors: instance 0 gave (1.0, 2.0), instance 1 "
            "(1.0, 1.5); every instance must give the same",
            "hvd.allreduce: Mismatched data types: instance 0 passed bfloat16, instance 1 float32; every instance "
            "must pass a tensor of the same dtype",
            "hvd.allreduce: Mismatched reduction operation: instance 0 asked for Average, instance 1 for Min; every "
            "instance must name the same op"]
        assert out["grouped_async"] == [[2.0, 2.0], [2.0]] and out["built"] == [False, False]


def test_horovod_collectives_refuse_before_init_and_after_shutdown() -> None:
    """As Horovod's ("call hvd.init() first"). Before, hvd.allreduce ran before init (its fast path once the
    fabric was joined, its general path joining it), while hvd.size() refused."""
    refused = "Horovod (poprun-py) is not initialised yet: call hvd.init() first"
    by_rank = records(run_poprun(*job(2), *python_program("horovod_before_init.py")))
    assert sorted(by_rank) == [0, 1]
    for out in by_rank.values():
        assert out["initialised"] == [2.0] * 4
        for when in ("before_init", "after_shutdown"):
            assert out[when] == {name: refused for name in out[when]} and len(out[when]) == 9, out[when]


def test_a_horovod_call_mismatch_names_the_call_the_header_begins() -> None:
    """hvd.allreduce against hvd.allgather: the allgather's first step, an exchange of shapes, is named as such.
    Before: "instance 1 called allgather on int64[18]", a call the user never made."""
    result = run_poprun(*job(2), *python_program("horovod_call_mismatch.py"))
    assert result.returncode != 0
    named = re.findall(r"CollectiveMismatchError: (.*)", result.stderr.decode())
    assert named and all("allreduce(mean) on float32[4]" in line and "allgather on int64[18] (the exchange of "
                         "shapes that begins an allgather of rows or of Python objects: hvd.allgather" in line
                         for line in named)


def test_a_horovod_allreduce_that_checks_first_against_a_plain_one_fails_on_every_instance() -> None:
    """An integer Average (a sum, then a local division: it compares op, factors and dtype first) against an
    integer Sum (the fabric's plain call): the fabric's mismatch on both, naming the comparison. Before, each
    instance got its own result, with exit 0."""
    result = run_poprun(*job(2), *python_program("horovod_call_mismatch.py", "integer-average"))
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("mismatch:")]
    assert len(lines) == 2, (lines, result.stderr.decode()[-2000:])
    assert all("allreduce(sum) on int64[2]" in line and "allgather on float64[2, 2] (hvd.allreduce's comparison "
               "of op, scale factors and dtype" in line for line in lines), lines
    assert result.returncode == 4


def test_horovod_in_launch_instances(spawn_instances) -> None:
    def average_of_ranks() -> list[float]:
        import horovod.torch as hvd

        hvd.init()
        return hvd.allreduce(torch.tensor([float(hvd.rank())])).tolist()

    assert spawn_instances(average_of_ranks, num_instances=3) == [[1.0]] * 3


@pytest.mark.poprun(num_instances=2)
def test_horovod_under_the_pytest_marker() -> None:
    import horovod.torch as hvd
    from mpi4py import MPI

    hvd.init()
    assert hvd.allreduce(torch.tensor(hvd.rank() + 1), op=hvd.Sum).item() == 3
    assert MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank + 1) == 3


@pytest.mark.poprun(num_instances=2)
def test_mpi4py_messages_and_splits_under_the_pytest_marker() -> None:
    """The marker's instances (forked) start with no message state of the parent's: a ping-pong of a small
    object and of a 256 KiB buffer (received straight into it), a local communicator, an alltoall, a
    synchronous send and nonblocking collectives."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    other = 1 - comm.rank
    for k in range(50):
        if comm.rank == 0:
            comm.send(k, dest=1)
            assert comm.recv(source=1) == k + 1
        else:
            comm.send(comm.recv(source=0) + 1, dest=0)
    buffer = np.full(1 << 15, float(comm.rank))
    comm.Sendrecv(buffer.copy(), dest=other, recvbuf=buffer, source=other)
    assert set(buffer.tolist()) == {float(other)}
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    assert (local.Get_rank(), local.Get_size()) == (comm.rank, 2)
    assert comm.alltoall([f"{comm.rank}->{k}" for k in range(2)]) == [f"{k}->{comm.rank}" for k in range(2)]
    sent = comm.issend(comm.rank, dest=other, tag=9)  # (synchronous: its reply comes once the peer matched it)
    assert comm.recv(source=other, tag=9) == other and sent.wait() is None
    total = np.zeros(1)
    running = comm.Iallreduce(np.array([comm.rank + 1.0]), total)
    comm.Ibarrier().Wait()
    running.Wait()
    assert total.tolist() == [3.0]


@pytest.mark.poprun(num_instances=2)
def test_horovod_fast_path_gives_the_general_paths_bits() -> None:
    """The common call (a float CPU tensor, no scaling, compression or gradient to track, strided or not) skips
    the general path's conversions: it must give the same bits, dtype and device, and leave every other call
    (found by ``Tensor.numpy()`` refusing it, or by its dtype) to the general path. Autograd off, a tensor that
    requires a gradient has none to track: ``Tensor.numpy()`` takes it, as ``detach()`` would."""
    import horovod.torch as hvd

    from popdist.horovod.torch import mpi_ops

    hvd.init()
    hvd.allreduce(torch.zeros(1))  # (the first collective joins the fabric: the fast path needs it joined)
    converted: list = []  # the tensors the general path converted
    general_conversion = mpi_ops.to_array

    def counted(tensor: torch.Tensor) -> Any:
        converted.append(tensor)
        return general_conversion(tensor)

    mpi_ops.to_array = counted

    def path(tensor: torch.Tensor, **kwargs: Any) -> tuple[str, torch.Tensor]:
        """Which path ``hvd.allreduce(tensor, **kwargs)`` took, and its result."""
        before = len(converted)
        result = hvd.allreduce(tensor, **kwargs)
        return ("general" if len(converted) > before else "fast"), result

    try:
        seed = torch.Generator().manual_seed(7 + hvd.rank())
        for dtype in (torch.float16, torch.float32, torch.float64):
            t = torch.randn(1000, generator=seed).to(dtype)
            for op in (None, hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
                taken, fast = path(t, op=op)
                general = mpi_ops._allreduce(t, op if op is not None else hvd.Average, 1.0, 1.0)
                assert taken == "fast" and fast.dtype is dtype and torch.equal(fast, general), (dtype, op)
        strided = torch.arange(8.0)[::2]
        taken, reduced = path(strided, op=hvd.Sum)
        assert taken == "fast" and reduced.tolist() == [0.0, 4.0, 8.0, 12.0] and reduced.is_contiguous()
        w = torch.ones(3, requires_grad=True)
        taken, reduced = path(w, op=hvd.Sum)
        assert taken == "general" and reduced.grad_fn is not None  # a gradient to track: the autograd function
        with torch.no_grad():
            taken, reduced = path(w, op=hvd.Sum)
        assert taken == "fast" and reduced.tolist() == [2.0, 2.0, 2.0] and not reduced.requires_grad
        taken, reduced = path(torch.tensor([hvd.rank() + 1]))
        assert taken == "general" and reduced.tolist() == [1]  # integers: Average truncates
        taken, reduced = path(torch.ones(2)._neg_view(), op=hvd.Sum)
        assert taken == "general" and reduced.tolist() == [-2.0, -2.0]  # a lazy negation bit, resolved
        taken, reduced = path(torch.ones(2, dtype=torch.bfloat16), op=hvd.Sum)
        assert taken == "general" and reduced.dtype is torch.bfloat16 and reduced.tolist() == [2.0, 2.0]
    finally:
        mpi_ops.to_array = general_conversion

# -- mpi4py -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("instances, total", [(2, 3), (3, 6)])
def test_mpi4py_allreduce_of_rank_plus_one(instances: int, total: int) -> None:
    result = run_poprun(*job(instances), *python_program("mpi_allreduce.py"))
    assert lines_of(result) == [f"rank {r} of {instances}: allreduce {total} Allreduce {float(total)} "
                                f"(popdist.mpi4py.MPI)" for r in range(instances)]


def test_gptj_style_sampler_broadcasts_from_rank_1_allgathers_and_gathers() -> None:
    import numpy as np

    result = run_poprun(*job(3), *python_program("gptj_sampler.py"))
    shards = np.random.default_rng(1234).permutation(40)[:12].tolist()
    assert lines_of(result) == [
        f"rank 0 of 3: seed 1234 sizes [10, 11, 12] gathered {shards}",
        "rank 1 of 3: seed 1234 sizes [10, 11, 12]",
        "rank 2 of 3: seed 1234 sizes [10, 11, 12]",
    ]


def test_mpi4py_semantics_over_three_instances() -> None:
    by_rank = records(run_poprun(*job(3), *python_program("mpi_semantics.py")))
    assert sorted(by_rank) == [0, 1, 2]
    for r, out in by_rank.items():
        assert out["bcast"] == {"root": 2} and out["allgather"] == [0, 10, 20]
        assert out["gather"] == (["r0", "r1", "r2"] if r == 1 else None)
        assert out["scatter"] == [r] * (r + 1) and out["reduce"] == (6 if r == 0 else None)
        assert out["allreduce_max"] == 2 and out["Allreduce"] == [6.0, 60.0]
        assert out["Reduce"] == ([1.0, 10.0] if r == 1 else [0.0, 0.0]) and out["Scatter"] == [2 * r, 2 * r + 1]
        assert out["self"] == [1, r + 5] and out["hasattr_Win"] is False
        # (before: "bcast: rank 3...", and the root's own error at the root alone, CollectiveMismatchError naming
        # broadcast and barrier on the others)
        assert out["scatter_refused"] == [
            "scatter: root 3 is not a rank of MPI_COMM_WORLD (0 to 2) (MPI_ERR_ROOT)",
            "scatter: the root (rank 0) gave 2 objects; it must give a sequence of 3, one for each rank",
            "Scatter: the root's buffer holds 6 elements, 3 ranks x 3 are needed (at the root, rank 0)"]
        assert out["threads"] == [True, True, False]  # (no Is_thread_main before)
        assert out["missing"].startswith("MPI.Comm.Create_intercomm is not provided by poprun-py's mpi4py")
        assert "Running Graphcore's programs" in out["missing"]
        assert out["missing_on_the_class"].startswith("MPI.Comm.Compare is not provided by poprun-py's mpi4py; see")
        assert out["exception"] == [True, False, 6, 6, 6, 6, "rank", "MPI_ERR_RANK: invalid rank",
                                    "Recv: rank 99 is not in MPI_COMM_WORLD (0 to 2) (MPI_ERR_RANK)", True]
        assert out["status"] == [2, 5, 15, 24, 3, False, False, 6]  # (15: MPI.ERR_TRUNCATE)
        assert out["datatypes"] == ["MPI_DOUBLE", "MPI_DOUBLE", "MPI_2INT", "d", "c", "q", "V", True]
        assert out["not_provided"] == ["MPI.Datatype.Create_vector is not provided by poprun-py's mpi4py (only the "
                                       "predefined datatypes are)", "MPI.Datatype.Create_contiguous is not provided "
                                       "by poprun-py's mpi4py", "MPI.Status.tomemory is not provided by poprun-py's "
                                       "mpi4py"]
        assert out["made"] == ["MPI_ERR_ARG: invalid argument", 13, True, False, True, 18,
                               "MPI_ERR_OTHER: other error", True]
        after = "called after MPI.Finalize(); MPI allows no call on a communicator once it is finalized (MPI_ERR_OTHER)"
        assert out["finalized"] == [True, [[True, f"MPI_COMM_WORLD.allreduce: {after}"],
                                           [True, f"a communicator that Dup made from MPI_COMM_WORLD.Get_rank: {after}"],
                                           [True, f"MPI_COMM_SELF.rank: {after}"],
                                           [True, "Finalize: called after MPI.Finalize(); MPI allows it once, and "
                                                  "no initialisation after it (MPI_ERR_OTHER)"]]]
    assert by_rank[2]["recv"] == {"hello": "from 0"} and by_rank[0]["recv"] == [1, 2, 3]
    assert by_rank[0]["Recv"] == [[4.5, 5.5], 1, 3]



@pytest.mark.parametrize("errorcode,status", [(-1, 255), (256, 1)])
def test_mpi4py_abort_exits_with_the_codes_low_byte_never_0(errorcode: int, status: int) -> None:
    """Open MPI's status (``errorcode & 0xFF``), except that a low byte of 0 exits 1: the job failed."""
    result = run_poprun(*job(3), *python_program("mpi_abort.py", str(errorcode)))
    assert result.returncode == status
    assert f"MPI.Abort(errorcode={errorcode}) called by rank 1 of MPI_COMM_WORLD".encode() in result.stderr
    assert b"passed the barrier" not in result.stdout

def test_mpi4py_buffers_are_read_and_written_in_memory_order() -> None:
    by_rank = records(run_poprun(*job(3), *python_program("mpi_buffers.py")))
    assert sorted(by_rank) == [0, 1, 2]
    for r, out in by_rank.items():
        assert out["fortran_allreduce"] == [[6.0, 6.0]] * 3  # (into the Fortran-ordered array itself, not a copy)
        assert out["fortran_bcast"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        assert out["count_spec"] == [0.0, 0.0] + [float(r)] * 2
        assert out["read_only_root"] == [[0.0, 1.0, 2.0], "abcd"]  # (the root raised NumPy's ValueError before)
        assert out["allgather_in_place"] == [0.0, 10.0, 20.0] and out["torch"] == [6.0] * 3
        assert out["not_contiguous"].startswith("Allreduce: the array is not contiguous in memory")
        assert out["alltoallw"][0] == "NotProvidedError" and "MPI.Comm.Alltoallw is not provided" in out["alltoallw"][1]
    assert by_rank[1]["recv_larger"] == [[0.0, 1.0, 2.0, -1.0, -1.0], 3, 24, 0]
    assert by_rank[1]["recv_shaped"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert by_rank[1]["read_only"] == "Recv: the receive buffer is read-only"
    assert by_rank[1]["truncated"] == ["Recv: message truncated: rank 0 sent 40 bytes, the receive buffer holds 16 "
                                       "(MPI_ERR_TRUNCATE)", True]
    assert by_rank[1]["bad_tag"] == ["send: tag -2 is not a tag: a message's tag is an int from 0 to 2147483647 "
                                     "(MPI_ERR_TAG)", True]
    assert by_rank[2]["gather_in_place"] == [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]]


def test_mpi4py_sends_are_standard_mode_and_match_by_tag() -> None:
    by_rank = records(run_poprun(*job(3), *python_program("mpi_messages.py")))
    assert sorted(by_rank) == [0, 1, 2]
    for r, out in by_rank.items():
        assert out["ring"] == f"from {(r - 1) % 3}" and out["self"] == {"me": r}
    assert by_rank[0]["exchange"] == 10 and by_rank[1]["exchange"] == 0
    assert by_rank[0]["tags"] == ["eight", 8, "seven"] and by_rank[2]["large"] is True
    assert by_rank[1]["contexts"] == ["on the world", "on the copy"] and by_rank[2]["self_dup"] == 1


@pytest.mark.parametrize("instances,transport", [(2, "auto"), (3, "auto"), (3, "tcp")])
def test_messages_sent_before_collectives_are_received_after_them(instances: int, transport: str) -> None:
    """As MPI buffers them (a CollectiveMismatchError on both ranks before): a small and an 8 MiB message, then
    a barrier, allreduces small and large, a broadcast and an allgather, then the receives."""
    by_rank = records(run_poprun(*job(instances), f"--fabric-transport={transport}",
                                 *python_program("mpi_message_across_collectives.py")))
    assert sorted(by_rank) == list(range(instances))
    total = instances * (instances - 1) // 2
    for r, out in by_rank.items():
        assert [out["allreduce"], out["Allreduce_small"], out["Allreduce_large"]] == [total] * 3
        assert out["bcast"] == f"root {instances - 1}" and out["allgather"] == list(range(instances))
        assert out["ring_after_barrier"] == (r - 1) % instances
    assert by_rank[1]["received"] == {"small": True} and by_rank[1]["received_big"] is True


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_mpi4py_nonblocking_and_any_source_match_as_mpi_does(transport: str) -> None:
    by_rank = records(run_poprun(*job(3), f"--fabric-transport={transport}", *python_program("mpi_nonblocking.py")))
    assert sorted(by_rank) == [0, 1, 2]
    assert by_rank[0]["master"] == {"1": 1, "2": 4}  # (ANY_SOURCE, the source from the status)
    assert [by_rank[r]["halo"] for r in range(3)] == [[2.0, 1.0], [0.0, 2.0], [1.0, 0.0]]
    assert by_rank[1]["posted_order"] == ["second", "first"]  # the receive posted first took the first message
    assert by_rank[2]["test_before"] == [False, None] and by_rank[2]["test_after"] == {"late": True}
    assert by_rank[2]["test_again"] == [True, None]
    assert by_rank[2]["probe"] == [0, 6, False] and by_rank[2]["probed"] == list(range(6))
    assert [by_rank[r]["sendrecv"] for r in range(3)] == [2, 0, 1]
    index, value, other = by_rank[0]["waitany"]
    assert [value, other] == (["from one", "from two"] if index == 0 else ["from two", "from one"])
    assert by_rank[0]["after_waitany"] == "from two, second" and by_rank[0]["truncated"] is True
    assert by_rank[1]["edges"] == [True, True, True]
    assert by_rank[1]["placed"] == [[1.0], [2.0], [3.0], [0.0] * 8, True]  # (each tag's into its own receive)
    assert by_rank[2]["scratch"] == [[51, 1 << 15, [51.0]], [52, 1 << 17, [52.0]], [54, 1 << 16, [54.0]],
                                     [53, 1 << 14, [53.0]]]
    order = by_rank[0]["in_turn"]  # (rank 2's came last: [1, 1, 1, 1, 1, 2])
    assert sorted(order) == [1, 1, 1, 1, 1, 2] and order.index(2) < 2, order
    for r in range(3):  # (each hung forever when a send waiting for room took only its destination's messages)
        assert by_rank[r]["big_sendrecv"] == by_rank[r]["big_isend"] == [float((r - 1) % 3)] * 2
    # an issend's request is not complete before its receiver matched it (before: NotProvidedError)
    assert by_rank[0]["synchronous"] == [False, False, True, 64.0] and by_rank[0]["tag_too_high"] is True
    assert by_rank[1]["synchronous"] == ["now receive it", "synchronous", [63.0]]
    assert [by_rank[r]["issend_ring"] for r in range(3)] == [f"ring from {(r - 1) % 3}" for r in range(3)]


def test_mpi4py_requests_and_statuses_in_their_corners(tmp_path: Path) -> None:
    result = run_poprun(*job(3), *python_program("mpi_requests.py", str(tmp_path / "sent")))
    by_rank = records(result)
    assert sorted(by_rank) == [0, 1, 2]
    assert by_rank[0]["first_test"] == [True, "early"]  # (False while the fabric connected at the first call)
    assert by_rank[1]["get_status"] == [0, 14, True, "fourteen"]  # (never True before: it took nothing)
    # Waitall completes the request after the one that failed, then raises; both are null after
    assert by_rank[0]["waitall"] == [True, [0.0, 1.0], [15, 0], [False, False], True]
    assert by_rank[0]["null_status"] == [-1, -1, 0] and by_rank[0]["waitany_null"] == -32766
    assert [by_rank[r]["halo"] for r in range(3)] == [[-1.0, 1.0], [0.0, 2.0], [1.0, -1.0]]
    for out in by_rank.values():
        assert out["self_source"] == 0 and out["status_copy"] is True  # (COMM_SELF's source was the world rank)
        assert out["from_null"] == [None, -2, 0] and out["irecv_null"] is None and out["bad_rank"] is True
        assert out["missing"] == ["NotProvidedError", "MPI.Request.Testany is not provided by poprun-py's mpi4py"]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_large_isend_returns_while_its_receiver_waits_for_another_rank(transport: str) -> None:
    """Rank 1 waits for rank 2, which waits for word from rank 0, sent after its 8 MiB Isend to rank 1: the
    wait on rank 2 took rank 0's message meanwhile (the job hung forever before)."""
    by_rank = records(run_poprun(*job(3), f"--fabric-transport={transport}",
                                 *python_program("mpi_isend_then_wait_elsewhere.py")))
    assert sorted(by_rank) == [0, 1, 2]
    assert by_rank[1]["heard"] == "go on" and by_rank[2]["heard"] == "go" and by_rank[1]["chain"] is True
    assert by_rank[1]["iprobe"] == ["polled by iprobe", True] and by_rank[1]["test"] == ["polled by test", True]
    assert [by_rank[r]["ring"] for r in range(3)] == [2.0, 0.0, 1.0]
    assert [by_rank[r]["allreduce"] for r in range(3)] == [3, 3, 3]


def test_comm_worlds_buffer_collectives_span_execute_on_instances_group() -> None:
    """Inside execute_on_instances, COMM_WORLD's Allreduce, Allgather and Bcast span the group as allreduce
    (pickled) and popdist.collectives do. Before, they spanned the whole job: a pair's Allreduce gave 1111,
    each single instance's too, with exit 0; and a rank reducing alone while another waited for its message
    failed the job with a false mismatch."""
    by_rank = records(run_poprun(*job(4), *python_program("mpi_instance_groups.py")))
    assert sorted(by_rank) == [0, 1, 2, 3]
    for r, out in by_rank.items():
        pair = (0, 1) if r < 2 else (2, 3)
        total = sum(10.0 ** p for p in pair)
        assert out["pair"] == {"Allreduce": total, "allreduce": total, "C": total, "Allgather": [float(p) for p in pair],
                               "Bcast": float(pair[1])}, out
        assert out["alone"] == 10.0 ** r and out["size"] == 4, out
    assert by_rank[0]["heard"] == "after"


def test_pickle_based_reductions_naming_different_ops_or_roots_raise_a_mismatch() -> None:
    """allreduce with SUM on rank 0 and PROD on rank 1 gave 3 and 2 with exit 0; reduce with each rank its own
    root gave each its own answer. Now they raise on every rank, as Allreduce does; so do gather, Gather and
    Reduce, and a root that is no rank (these three and reduce returned as if it were fine)."""
    by_rank = records(run_poprun(*job(2), *python_program("mpi_mismatched_ops.py")))
    for out in by_rank.values():
        assert out["allreduce"] == ("allreduce: the ranks called it differently (rank 0 op=SUM, rank 1 op=PROD); "
                                    "every rank must name the same op and root"), out
        assert out["reduce"].startswith("reduce: the ranks called it differently (rank 0 op=SUM root=0, "
                                        "rank 1 op=SUM root=1)"), out
        assert out["scan"].startswith("scan: the ranks called it differently (rank 0 op=MAX, rank 1 op=MIN)"), out
        # the gathers and Reduce with each rank its own root gave two ranks the whole result, exit 0; a root that
        # is no rank "succeeded" on every rank with the data dropped
        assert out["gather"].startswith("gather: the ranks called it differently (rank 0 root=0, rank 1 root=1)")
        for name in ("Gather", "Reduce"):
            assert out[name] == (f"{name}: the ranks called it differently (rank 0 root=0, rank 1 root=1); every "
                                 "rank must name the same root"), out
        for name in ("gather", "reduce", "Reduce"):
            for root in (2, -1):
                message, error_class = out[f"{name}_root_{root}"]
                assert message == f"{name}: root {root} is not a rank of MPI_COMM_WORLD (0 to 1) (MPI_ERR_ROOT)"
                assert error_class == 8  # (Open MPI's MPI_ERR_ROOT; ERR_RANK, 6, before)
        assert out["error_classes"] == [[0, "MPI_SUCCESS"], [1, "MPI_ERR_BUFFER"], [8, "MPI_ERR_ROOT"],
                                        [16, "MPI_ERR_OTHER"]]
        assert out["after"] == 3


def test_split_communicators_hold_their_ranks_collectives_and_messages() -> None:
    """Split_type(COMM_TYPE_SHARED) (the local-rank idiom), Split by parity, a rank left out with UNDEFINED
    (COMM_NULL, whose calls raise ERR_COMM); a message in a split comm and one in COMM_WORLD with the same tag
    each reach its own receive; keys that reverse the ranks. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(4), *python_program("mpi_split.py")))
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert [by_rank[r]["local"] for r in range(4)] == [[r, 4, 4] for r in range(4)]
    assert [by_rank[r]["parity"] for r in range(4)] == [[0, 2, [0, 2]], [0, 2, [1, 3]], [1, 2, [0, 2]],
                                                       [1, 2, [1, 3]]]
    assert [by_rank[r]["parity_sum"] for r in range(4)] == [2.0, 4.0, 2.0, 4.0]
    assert [by_rank[r].get("parity_message") for r in (2, 3)] == ["parity from 0", "parity from 1"]
    assert [by_rank[r].get("world_message") for r in (2, 3)] == ["world from 0", "world from 1"]
    assert by_rank[3]["left_out"] is True and by_rank[3]["null_call"] is True
    assert [by_rank[r]["rest"] for r in range(3)] == [[3, "root 0"]] * 3
    assert [by_rank[r]["joined"] for r in range(4)] == [True, True, True, False]  # (was True for COMM_NULL)
    for out in by_rank.values():  # a freed communicator is COMM_NULL; the world and COMM_NULL cannot be freed
        assert out["freed"] == [True, False] and out["free_errors"] == [True] * 4 and out["with_info"] == 4
        # (before: Dup's name was MPI_COMM_WORLD, Split's "MPI_COMM_WORLD Split"; no Set_name)
        assert out["names"] == ["MPI_COMM_WORLD", "MPI_COMM_SELF", "", "", "", "bcast: root 5 is not a rank of a "
                                "communicator that Split made from MPI_COMM_WORLD (0 to 1) (MPI_ERR_ROOT)", "mine", "",
                                "renamed"]
    # keys that reverse the ranks (ERR_ARG, not provided, before): gathers in the new ranks' order, the scan
    # over the new ranks before, the broadcast from the new rank 0 (world rank 3)
    assert [by_rank[r]["reversed"] for r in range(4)] == [
        [3 - r, [3, 2, 1, 0], [3.0, 2.0, 1.0, 0.0], float(sum(range(r, 4))), 3] for r in range(4)]


@pytest.mark.parametrize(("instances", "transport"), [(3, "auto"), (4, "tcp")])
def test_alltoall_sends_each_rank_its_own_block(instances: int, transport: str) -> None:
    """alltoall of objects, Alltoall of 32 B and 256 KiB blocks, on COMM_WORLD beside a user's message with the
    same tag, and on a Split communicator; Alltoallv. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(instances), f"--fabric-transport={transport}",
                                 *python_program("mpi_alltoall.py")))
    assert sorted(by_rank) == list(range(instances))
    for r, out in by_rank.items():
        assert out["alltoall"] == [f"{k}->{r}" for k in range(instances)]
        assert out["Alltoall_4"] == out["Alltoall_32768"] == [[k * 100.0 + r] for k in range(instances)]
        assert out["user_message"] == f"user message from {(r - 1) % instances}"
        assert out["split"] == [[k, r // 2] for k in range(r % 2, instances, 2)]
        # a spec's count is one rank's (2 items for each rank); before, the whole buffer's
        assert out["Alltoall_counted"] == [*[v for k in range(instances) for v in (k * 100 + 2 * r, k * 100 + 2 * r + 1)], -1]
        assert out["Allgather_counted"] == [*[v for k in range(instances) for v in (k * 100, k * 100 + 1)], -1]
        takes = [k + r + 1 + (20000 if (k, r) == (0, instances - 1) else 0) for k in range(instances)]
        assert out["Alltoallv"] == [[k * 100.0 + r, c] for k, c in enumerate(takes)]  # (was NotProvidedError)
        assert out["Alltoallv_gaps"] == [-1.0] * instances
    last = instances - 1  # its blocks are larger: the others' receive names it (before: rank 0)
    for r in range(last):
        assert by_rank[r]["truncated"] == f"Alltoall: message truncated: rank {last} sent 16 bytes, the receive " \
                                          "buffer holds 8 (MPI_ERR_TRUNCATE)"
    assert by_rank[last]["truncated"] is None


@pytest.mark.parametrize(("argument", "named"), [
    ("mismatch", r"instance 0 waits for a message from instance\(s\) 1, 2 but instance 1 called barrier and "
                 r"instance 2 called barrier first"),
    ("exchange", r"(Alltoall: rank [12] called Scatterv\(root=0\) where rank 0 called Alltoall"
                 r"|Scatterv: rank 0 called Alltoall where rank [12] called Scatterv\(root=0\))"),
])
def test_an_alltoall_against_another_call_stops_the_job_naming_both_calls(argument: str, named: str) -> None:
    """Against a Barrier; against a Scatterv, whose messages are in the same context (before: rank 0 took the
    Scatterv's blocks for its own, and the job ended with 0)."""
    result = run_poprun(*job(3), *python_program("mpi_alltoall.py", argument))
    assert result.returncode != 0
    assert re.search("CollectiveMismatchError: " + named, result.stderr.decode())


#: Long past the few seconds these runs take on a loaded machine; a job still running then hangs.
HANG_BOUND = 30


@pytest.mark.parametrize(("exchange", "broadcast", "who", "blocks"), [
    ("Alltoall", "Bcast", "root", "small"), ("alltoall", "bcast", "root", "small"),
    ("Alltoall", "scatter", "root", "small"), ("Alltoall", "Bcast", "root", "large"),
    ("Alltoall", "Bcast", "others", "small"), ("alltoall", "bcast", "others", "small"),
    ("alltoall", "Scatter", "others", "small"), ("Alltoall", "Bcast", "others", "large"),
])
def test_an_exchange_against_a_small_broadcast_from_its_root_stops_every_rank_naming_both(
        exchange: str, broadcast: str, who: str, blocks: str) -> None:
    """Three ranks on one host: rank 0 in an all-to-all while the others are in a small broadcast from it
    (``who`` "root"), or the other way round. Before, the first order waited for ever on every rank (the
    broadcast's readers send their root nothing, and took its block for a message to keep); in the second the
    root returned and ended with 0, and the others raised PeerLostError once it had gone. Now every rank raises
    CollectiveMismatchError naming both calls (the root of the second order as its fabric closes at exit,
    once the others have said why they cannot take its broadcast: past their blocks, large ones too)."""
    try:
        result = run_poprun(*job(3), "--tag-output=yes",
                            *python_program("mpi_exchange_vs_broadcast.py", exchange, broadcast, who, blocks),
                            timeout=HANG_BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{exchange} against {broadcast}: the job was still running after {HANG_BOUND} s")
    assert result.returncode != 0
    stderr = result.stderr.decode()
    errors: dict[int, str] = {}
    for rank, message in re.findall(r"^\[1,(\d)\]<stderr>:(?:simipu\.fabric\.errors\.)?CollectiveMismatchError: "
                                    r"(.*)$", stderr, re.MULTILINE):
        errors.setdefault(int(rank), message)
    assert sorted(errors) == [0, 1, 2], stderr
    array = r"\w+\[[\d, ]+\]"  # (the fabric's call: its dtype and shape)
    named = (rf"instance ([12]) called broadcast\(root=0\) on {array} but instance 0 called {exchange} first \(a "
             rf"collective whose blocks travel as messages: instance 0 waits there for instance \1's block, and "
             rf"instance \1 here for instance 0's frame\)" if who == "root" else
             rf"instance ([12]) waits for a message from instance\(s\) 0 but instance 0 called broadcast\(root=0\) "
             rf"on {array} first: no message can come before this instance joins it \(instance \1 called {exchange}, "
             rf"whose blocks travel as messages\)")
    for rank, message in errors.items():  # (rank 0 learns it from the others, which tell every peer)
        told = rf"( \(reported by instance [{''.join(str(k) for k in range(3) if k != rank)}]\))" + "?" * (rank > 0)
        assert re.fullmatch(named + told, message), (rank, message)
    returned = re.findall(r"^\[1,(\d)\]<stdout>:rank \d returned", result.stdout.decode(), re.MULTILINE)
    assert returned == ([] if who == "root" else ["0"]), result.stdout.decode()


def test_an_exchange_s_block_not_received_yet_names_the_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a small broadcast's reader asks of its root's messages not received yet (the fabric's, in the order
    they came, and those mpi4py took from it while it waited for others): whether one is a block of an
    exchange, and of which call. A user's message is not, nor the bytes of a large one however they begin, nor
    a neighbour collective's or a nonblocking one's part."""
    import numpy as np

    from popdist.mpi4py import matching
    from popdist.mpi4py.alltoall import exchange_of, exchange_tag
    from popdist.mpi4py.neighbours import CONTEXT_BASE as NEIGHBOURS
    from simipu.fabric.frames.header import collective_of

    def envelope(tag: int, nbytes: int, context: int, inline: bool = True) -> bytes:
        return struct.pack("=3q", tag, nbytes, context) + (bytes(nbytes) if inline else b"")

    alltoall = envelope(exchange_tag("Alltoall"), 8, -2)
    assert exchange_of(0, [envelope(5, 3, 0), alltoall]) == collective_of(0, [alltoall]) == "Alltoall"
    assert exchange_of(0, [envelope(exchange_tag("Scatterv", 2), 0, -2 - 12345)]) == "Scatterv(root=2)"
    large = envelope(5, matching.INLINE_BYTES + 24, 0, inline=False)  # (its bytes next, here like an envelope)
    assert exchange_of(0, [large, alltoall + bytes(matching.INLINE_BYTES - 8)]) is None
    assert exchange_of(0, [large, bytes(matching.INLINE_BYTES + 24), alltoall]) == "Alltoall"
    assert exchange_of(0, [envelope(1, 0, NEIGHBOURS), envelope(1, 0, NEIGHBOURS - 7), envelope(1, 0, -1)]) is None
    assert exchange_of(0, [b"\0" * 8]) is None
    kept = matching.Message(-3, 1, exchange_tag("alltoall"), np.zeros(1, np.uint8))
    monkeypatch.setattr(matching._state, "arrived", [matching.Message(0, 1, 5, np.zeros(1, np.uint8)), kept])
    assert exchange_of(1, []) == "alltoall" and exchange_of(2, []) is None


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_vector_collectives_put_each_ranks_block_in_its_place(transport: str) -> None:
    """Allgatherv (default displacements, its own, in place), Gatherv, Scatterv with a block above the inline
    size, in mpi4py's spec forms. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(3), f"--fabric-transport={transport}", *python_program("mpi_vectors.py")))
    assert sorted(by_rank) == [0, 1, 2]
    packed = [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    for out in by_rank.values():
        assert out["allgatherv"] == out["allgatherv_in_place"] == packed
        assert out["allgatherv_displaced"] == [0.0, -1.0, 1.0, 1.0, -1.0, 2.0, 2.0, 2.0, -1.0]
        assert out["allgatherv_even"] == [0.0, 0.0, 1.0, 2.0]  # (before: IndexError)
        assert out["allgatherv_strided"] == [0.0, -1.0, 1.0, -1.0, 2.0, -1.0]
        assert out["allgatherv_alike"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert by_rank[1]["gatherv"] == packed and "gatherv" not in by_rank[0]
    assert [by_rank[r]["scatterv"] for r in range(3)] == [[3, 0.0, 2.0], [1, 3.0, 3.0], [16384, 4.0, 16387.0]]


def test_prefix_reductions_reduce_each_ranks_prefix_in_rank_order() -> None:
    """scan/exscan of objects, Scan/Exscan of buffers (Exscan leaves rank 0's as it was), Scan in place.
    Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(3), *python_program("mpi_scans.py")))
    assert [by_rank[r]["scan"] for r in range(3)] == [1, 3, 6]
    assert [by_rank[r]["scan_max"] for r in range(3)] == [10, 10, 10]
    assert [by_rank[r]["exscan"] for r in range(3)] == [None, 1, 3]
    assert [by_rank[r]["Scan"] for r in range(3)] == [[1.0, 0.0], [3.0, 2.0], [6.0, 6.0]]
    assert [by_rank[r]["Scan_in_place"] for r in range(3)] == [[1.0, 0.0], [3.0, 2.0], [6.0, 6.0]]
    assert [by_rank[r]["Exscan_prod"] for r in range(3)] == [[-1.0, -1.0], [1.0, 0.0], [2.0, 0.0]]
    assert [by_rank[r]["own_object"] for r in range(3)] == [[False] * 4] * 3  # (scan and allreduce were True)


@pytest.mark.parametrize(("instances", "transport"), [(3, "auto"), (4, "tcp")])
def test_nonblocking_collectives_complete_while_the_ranks_do_other_work(instances: int, transport: str) -> None:
    """The sparse exchange (Issend, then Ibarrier tested while receiving), an Iallreduce across a ring of
    messages, a send after an Ibarrier to a rank that receives before its own, every kind under one Waitall.
    Before: NotProvidedError."""
    import numpy as np

    by_rank = records(run_poprun(*job(instances), f"--fabric-transport={transport}",
                                 *python_program("mpi_nonblocking_collectives.py")))
    assert sorted(by_rank) == list(range(instances))
    n = instances
    for r, out in by_rank.items():
        assert out["nbx"] == sorted(f"from {(r - hop) % n}" for hop in (1, 2))
        assert out["ring"] == (r - 1) % n and out["iallreduce"] == [float(sum(range(n))), float(n)]
        bcast, everyone, gathered, scattered, reduced, exchanged, product, all_null = out["all_kinds"]
        assert bcast == [1.0] * 3 and everyone == [v for k in range(n) for v in (k, k + 0.5)]
        assert gathered == ([float(k * k) for k in range(n)] if r == 2 else None)
        assert scattered == [10.0 * r] and reduced == ([float(n - 1)] if r == 1 else None)
        assert exchanged == [r + 100.0 * k for k in range(n)]
        assert product == [float(np.prod(range(1, n + 1)))] and all_null is True
    assert by_rank[1]["before_ibarrier"] == "after my Ibarrier"
    for r, out in by_rank.items():  # (the buffer was still zeros when Get_status said complete; the
        # all-to-alls refused MPI.IN_PLACE, and Bcast's was a TypeError)
        assert out["get_status_filled"] == [float(n)] * 3
        column = [float(r + 10 * k) for k in range(n)]
        assert out["in_place"] == [column, column, column, [-1.0 if r == 0 else float(r)], True]
        packed = [float(k) for k in range(n) for _ in range(k + 1)]
        start = sum(range(1, r + 1))  # (rank r's block of the scattered range: r + 1 items from here)
        assert out["prefix_and_vectors"] == [  # (NotProvidedError before)
            [float(sum(range(1, r + 2)))], [-1.0] if r == 0 else [float(np.prod(range(1, r + 1)))], packed,
            packed if r == 1 else None, [float(start + i) for i in range(r + 1)],
            [10.0 * k + r for k in range(n) for _ in range(r + 1)]]


def test_nonblocking_collectives_of_different_kinds_name_both() -> None:
    result = run_poprun(*job(3), *python_program("mpi_nonblocking_collectives.py", "mismatch"))
    assert result.returncode != 0
    assert re.search(r"CollectiveMismatchError: (Iallreduce: rank 0 called Ibarrier as nonblocking collective #1 "
                     r"where rank [12] called Iallreduce|Ibarrier: rank [12] called Iallreduce as nonblocking "
                     r"collective #1 where rank 0 called Ibarrier)", result.stderr.decode())


def test_a_master_receives_from_any_source_after_its_workers_have_exited() -> None:
    result = run_poprun(*job(3), *python_program("mpi_workers_finish_first.py"))
    assert lines_of(result) == ["[(1, 100), (2, 200)]"]  # (PeerLostError for the first worker gone, before)


def test_a_receive_from_any_source_that_no_rank_can_meet_raises_on_every_rank() -> None:
    lines = lines_of(run_poprun(*job(3), *python_program("mpi_any_source_vs_collective.py")))
    assert len(lines) == 3, lines
    for line in lines:
        assert "CollectiveMismatchError: instance 0 waits for a message from instance(s) 1, 2 but instance 1 " \
               "called barrier and instance 2 called barrier first" in line, lines


# -- how programs find them, and the off switch -----------------------------------------------------------
def test_our_mpi4py_wins_over_an_installed_one_under_poprun() -> None:
    result = run_poprun(*job(2), *python_program("mpi_allreduce.py"), env=env_with(PYTHONPATH=str(STAND_IN)))
    assert lines_of(result) == [f"rank {r} of 2: allreduce 3 Allreduce 3.0 (popdist.mpi4py.MPI)" for r in range(2)]


def test_compat_imports_no_stops_a_real_mpi_that_sees_one_process() -> None:
    result = run_poprun(*job(2), "--compat-imports=no", *python_program("mpi_allreduce.py"),
                        env=env_with(PYTHONPATH=str(STAND_IN)))
    assert result.returncode != 0
    assert b"allreduce 1" not in result.stdout  # no instance ran alone
    err = result.stderr.decode()
    assert "SingletonMPIError: mpi4py here is the installed library, and its COMM_WORLD is 1 while this poprun " \
           "job has 2 instances" in err
    assert "Drop --compat-imports=no" in err


def test_compat_imports_no_stops_a_real_horovod_that_sees_one_process() -> None:
    result = run_poprun(*job(2), "--compat-imports=no", *python_program("host_benchmark.py"),
                        env=env_with(PYTHONPATH=str(STAND_IN)))
    assert result.returncode != 0 and b"slowest" not in result.stdout
    err = result.stderr.decode()
    assert "SingletonMPIError: horovod here is the installed library, and hvd.size() is 1 while this poprun " \
           "job has 2 instances" in err
    assert "or start the program with horovodrun instead of poprun" in err


def test_compat_imports_no_leaves_imports_to_the_installed_packages() -> None:
    if importlib.util.find_spec("mpi4py") is not None or importlib.util.find_spec("horovod") is not None:
        pytest.skip("a real mpi4py or horovod is installed here")
    result = run_poprun(*job(2), "--compat-imports=no", *python_program("imports_of.py", "mpi4py", "horovod.torch"))
    assert lines_of(result) == ["horovod.torch: ModuleNotFoundError: No module named 'horovod'"] * 2 + \
        ["mpi4py: ModuleNotFoundError: No module named 'mpi4py'"] * 2


def test_modules_that_are_not_provided_say_so_under_poprun() -> None:
    result = run_poprun(*job(1), *python_program("imports_of.py", "horovod.tensorflow", "horovod.torch"))
    first, second = lines_of(result)
    assert first.startswith("horovod.tensorflow: ModuleNotFoundError: No module named 'horovod.tensorflow': "
                            "under poprun, horovod resolves to poprun-py's popdist.horovod")
    assert second == "horovod.torch: popdist.horovod.torch"


def test_outside_poprun_imports_are_untouched() -> None:
    if importlib.util.find_spec("horovod") is not None:
        pytest.skip("a real horovod is installed here")
    code = ("import sys, _poprun_py_hook; print([type(f).__name__ for f in sys.meta_path "
            "if type(f).__module__ == '_poprun_py_hook'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=RUN_TIMEOUT,
                            env=outside_poprun())
    assert result.stdout.decode().strip() == "[]", result.stderr
    result = subprocess.run(python_program("imports_of.py", "horovod"), capture_output=True,
                            timeout=RUN_TIMEOUT, env=outside_poprun())
    assert result.stdout.decode().splitlines() == ["horovod: ModuleNotFoundError: No module named 'horovod'"]
    result = subprocess.run(python_program("imports_of.py", "horovod.torch", "mpi4py.MPI"), capture_output=True,
                            timeout=RUN_TIMEOUT, env=outside_poprun(PYTHONPATH=str(STAND_IN)))
    assert result.stdout.decode().splitlines() == ["horovod.torch: horovod.torch",  # the installed (stand-in) ones
                                                   "mpi4py.MPI: mpi4py.MPI"]


def test_verbose_output_says_what_python_programs_get() -> None:
    on = run_poprun("-v", *job(1), "true")
    off = run_poprun("-v", *job(1), "--compat-imports=no", "true")
    assert "POPRUN [I] Python programs: horovod and mpi4py resolve to poprun-py's (popdist.horovod, " \
           "popdist.mpi4py)" in on.stderr.decode()
    assert "--compat-imports=no turns this off" in on.stderr.decode()
    assert "Python programs: horovod and mpi4py are the installed packages (--compat-imports=no)" in off.stderr.decode()


def test_the_hook_spells_the_contract_names_as_popdist_does() -> None:
    import _poprun_py_hook as hook
    from popdist import env_names

    assert (hook.LAUNCH, hook.LOCAL_REPLICAS, hook.SWITCH) == (
        env_names.TOTAL_REPLICAS, env_names.LOCAL_REPLICAS, env_names.COMPAT_IMPORTS)


def test_a_wheel_installs_the_pth_into_site_packages(tmp_path: Path) -> None:
    """The hook works from a wheel too, not only from the editable install the tests run on."""
    root = tmp_path / "project"  # a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(Path(__file__).parent.parent, root, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "tests", "benchmarks"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(root)], check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("poprun_py-*.whl")
    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, check=True, timeout=RUN_TIMEOUT).stdout.decode().strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, str(wheel)],
                   check=True, timeout=300, capture_output=True)
    source = Path(__file__).resolve().parent.parent / "src" / "poprun_py_hook.pth"
    assert (Path(site) / "poprun_py_hook.pth").read_text() == source.read_text()
    code = "import horovod, popdist; print(horovod.__name__, popdist.__file__)"
    launched = outside_poprun(POPDIST_NUM_TOTAL_REPLICAS="1")
    result = subprocess.run([python, "-c", code], capture_output=True, timeout=RUN_TIMEOUT, env=launched,
                            cwd=tmp_path)
    name, where = result.stdout.decode().split()
    assert name == "popdist.horovod" and where.startswith(site), result.stderr


def test_compat_imports_takes_yes_or_no() -> None:
    result = run_poprun(*job(1), "--compat-imports=maybe", "true")
    assert result.returncode == 2
    assert result.stderr.decode().count("\n") == 1 and "compat" in result.stderr.decode()


# -- the example ----------------------------------------------------------------------------------------------
def test_horovod_example_trains_in_step_and_checkpoints_on_instance_0(tmp_path: Path) -> None:
    checkpoint = tmp_path / "new" / "model.pt"  # (a directory that is not there yet: the example makes it)
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--tag-output",
                        *python_example("horovod_train.py", "--checkpoint", str(checkpoint)))
    lines = lines_of(result)
    saved = [line for line in lines if "saved the checkpoint" in line]
    assert saved == [f"[1,0]<stdout>:instance 0 saved the checkpoint of step 60 to {checkpoint}"]
    losses = [float(line.split("loss ")[1]) for line in lines if "]<stdout>:step " in line]
    assert len(losses) == 3 and all(line.startswith("[1,0]") for line in lines if "]<stdout>:step " in line)
    assert losses[-1] < 0.01  # learnt: the noise's variance is 1e-4, an untrained model's loss is about 5
    finals = [line.split(":", 1)[1] for line in lines if "the same on every instance" in line]
    assert len(finals) == 2 and all(line.endswith("the same on every instance: True") for line in finals)
    assert finals[0].split(": weights ")[1] == finals[1].split(": weights ")[1]
    state = torch.load(checkpoint)
    assert state["step"] == 60
    learnt = [round(w, 3) for w in torch.cat([state["model"]["weight"].reshape(-1), state["model"]["bias"]]).tolist()]
    assert finals[0].split(": weights ")[1].startswith(str(learnt))


def test_horovod_example_save_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    """The second save's writes fail past half the checkpoint's size (``file_size_limit.py``), as a Ctrl-C, a
    SIGTERM or a full disk would stop them. Before, ``torch.save`` wrote the checkpoint's own path and left it
    truncated."""
    checkpoint = tmp_path / "model.pt"
    one = ("--offline-mode=1", "--num-instances", "1", "--num-replicas", "1")
    first = run_poprun(*one, *python_example("horovod_train.py", "--steps", "2", "--checkpoint", str(checkpoint)))
    assert first.returncode == 0, first.stderr
    good = checkpoint.read_bytes()
    interrupted = run_poprun(*one, sys.executable, str(PROGRAMS / "file_size_limit.py"), str(len(good) // 2),
                             python_example("horovod_train.py")[1], "--steps", "3", "--checkpoint", str(checkpoint))
    assert interrupted.returncode == 1, interrupted.stderr  # (EFBIG: "File too large")
    assert checkpoint.read_bytes() == good
    assert os.listdir(tmp_path) == ["model.pt"]  # no temporary file left behind either


@pytest.mark.parametrize("argv, error", [(("--batch-size", "0"), "--batch-size must be at least 1"),
                                         (("--steps", "0"), "--steps must be at least 1")])
def test_horovod_example_bad_arguments_are_one_line_errors(argv: tuple[str, ...], error: str) -> None:
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
                        *python_example("horovod_train.py", *argv))
    assert result.returncode == 2 and error in result.stderr.decode(), result.stderr
    assert b"Traceback" not in result.stderr


def test_a_buffer_spec_is_read_as_mpi4py_reads_it() -> None:
    """Every form of mpi4py's ``message_simple``; a collective's count is one rank's. Before, ``[buffer, count]``
    sent the whole buffer, a displacement was taken for a datatype, and ``Alltoall`` read 2 items for all ranks."""
    import numpy as np

    from popdist.mpi4py.specs import buffer_of

    items = np.arange(10, dtype=np.int32)
    assert buffer_of([items, 3], "Send").tolist() == [0, 1, 2]
    assert buffer_of([items, (3, 2)], "Send").tolist() == [2, 3, 4]
    assert buffer_of([items, [3, 2], "i"], "Send").tolist() == [2, 3, 4]  # (a NumPy type code, as mpi4py's)
    assert buffer_of([items, 2, 1, "i"], "Send").tolist() == [1, 2]
    assert buffer_of([items, 2, "i"], "Alltoall", blocks=3).tolist() == [0, 1, 2, 3, 4, 5]
    assert buffer_of([items, "i"], "Alltoall", blocks=3).size == 10  # (no count: all of it, split by the call)
    with pytest.raises(ValueError, match=r"^Alltoall: count 4 for each of 3 ranks from item 0 is more than the "
                                         r"buffer's 10 items"):
        buffer_of([items, 4, "i"], "Alltoall", blocks=3)
    with pytest.raises(ValueError, match=r"^Send: a buffer spec is a buffer or a list of 2 to 4 items"):
        buffer_of([items], "Send")


def test_a_vector_spec_is_read_as_mpi4py_reads_it_and_a_wrong_one_says_what_one_is() -> None:
    import numpy as np

    from popdist.mpi4py.specs import MPIException
    from popdist.mpi4py.vectors import vector_of

    flat, places = vector_of([np.zeros(6), ([1, 2], [4, 0])], 2, "Allgatherv")
    assert flat.size == 6 and places == [slice(4, 5), slice(0, 2)]
    assert vector_of([np.zeros(6), [1, 2]], 2, "Gatherv")[1] == [slice(0, 1), slice(1, 3)]  # (running sum)
    assert vector_of(np.zeros(5), 2, "Allgatherv")[1] == [slice(0, 3), slice(3, 5)]  # (no counts: split evenly)
    assert vector_of([np.zeros(6), 2], 3, "Allgatherv")[1] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert vector_of([np.zeros(6), (1, 3), None], 2, "Allgatherv")[1] == [slice(0, 1), slice(3, 4)]  # (strided)
    # an empty block may be placed past the end, as MPI's (it was refused)
    assert vector_of([np.zeros(1), [1, 0], [0, 5], None], 2, "Alltoallv")[1] == [slice(0, 1), slice(5, 5)]
    with pytest.raises(ValueError, match=r"^Allgatherv: a tuple in a buffer spec is \(count, displacement\), "
                                         r"here 3 items"):
        vector_of([np.zeros(6), (1, 2, 3)], 3, "Allgatherv")
    with pytest.raises(MPIException, match=r"^Gatherv: counts must be 2 ints from 0, one for each rank"):
        vector_of([np.zeros(4), [1]], 2, "Gatherv")
    with pytest.raises(ValueError, match=r"^Scatterv: the counts and displacements reach past the buffer's 4 items"):
        vector_of([np.zeros(4), [2, 3]], 2, "Scatterv")


def test_mpi4py_reductions_beyond_the_arithmetic_four_give_what_open_mpi_gives() -> None:
    """LAND/LOR/LXOR/BAND/BOR/BXOR, MAXLOC/MINLOC on objects and on the pair types, a user's ``Op.Create``,
    ``Reduce_local`` and the reduce-scatters: the values Open MPI 4.1 with mpi4py 4 gave for the same program.
    Before: each raised NotProvidedError."""
    by_rank = records(run_poprun(*job(3), *python_program("mpi_reductions.py")))
    assert sorted(by_rank) == [0, 1, 2]
    refused = ["Allreduce: MPI.LAND does not reduce a buffer of float64", "Allreduce: MPI.BOR does not reduce a "
               "buffer of bool", "Allreduce: MPI.MAXLOC does not reduce a buffer of int32 (it reduces (value, "
               "index) pairs", "Allreduce: MPI.REPLACE does not reduce", "Op.Free: <mpi4py.MPI.Op SUM> is predefined",
               "Allreduce: MPI.SUM does not reduce a buffer of bool", "Allreduce: MPI.MAX does not reduce a buffer of "
               "complex64"]
    for r, out in by_rank.items():
        assert out["objects"] == [True, False, False, 7, 4, 0, True]
        assert out["locations"][:3] == [[1, 1], [0, 0], [5, 1]] and out["locations"][3] == ([3.0, 2] if r == 1 else None)
        assert out["buffers"] == [[0, 1, 1], [0, 1, 1], [0, 0, 1], [4, 7, 6], [7, 1, 2], [0, 1, 2],
                                  [True, False, True], [False, True]]
        assert [ok for ok, _ in out["refused"]] == [True] * 7
        assert all(message.startswith(start) for (_, message), start in zip(out["refused"], refused))
        assert out["pairs"] == [[[1.0, 1], [2.0, 2], [1.0, 0]], [[0.0, 0], [0.0, 0], [1.0, 0]], [[1, 1], [2, 2]], 12, 16]
        assert out["nan_pairs"] == [[[3.0, 2]], [[3.0, 2]]]  # (Open MPI keeps the higher rank's unless beaten)
        assert out["packed_pairs"] == "Allreduce: the buffer's 36 bytes are not a whole number of MPI_DOUBLE_INT items " \
                                      "(16 bytes apart)"
        assert out["user"][0] == "((0.1).2)" and out["user"][1:3] == [["0", "(0.1)", "((0.1).2)"][r],
                                                                        [None, "0", "(0.1)"][r]]
        assert out["user"][3:] == [[12, 123], [[0, 1], [1, 12], [12, 123]][r], [31, 42], [11, 22],
                                   [False, True, False, True]]
        assert out["user_nonblocking"] == [12, 123]  # (Open MPI's libnbc: [1012, 23]; the op does not associate)
        assert out["freed"][:3] == [True, False, False] and out["freed"][3][0] == "ValueError"
        assert out["reduce_scatter"] == [
            [[300, 303], [306, 309], [312, 315]][r],
            [[300, 303, 2, 3, 4, 5], [306, 309, 102, 103, 104, 105], [312, 315, 202, 203, 204, 205]][r],
            [[300], [303, 306], [309, 312, 315]][r], [[200], [201, 202], [203, 204, 205]][r],
            [[300, 1, 2, 3, 4, 5], [303, 306, 102, 103, 104, 105], [309, 312, 315, 203, 204, 205]][r],
            [[236, 237], [238, 239], [236, 237]][r], [[300], [303, 306], [309, 312, 315]][r]]
        assert out["counted"] == out["reduce_scatter"][:2]  # (a spec's count is one rank's block, as mpi4py's)
        assert out["bad_count"] == f"Reduce_scatter: the receive buffer holds 4 items, recvcounts[{r}] is {r + 1}"


def test_reduction_operations_on_one_rank_and_on_objects() -> None:
    """mpi4py's ``Op`` outside poprun (a world of one): calls on objects, ``Reduce_local``, a pair type's size
    and extent, what is refused; unhashable and compared by handle, as mpi4py's."""
    import numpy as np

    from popdist.mpi4py import MPI

    assert MPI.MAXLOC((1, 2), (1, 0)) == (1, 0) and MPI.MINLOC((1, 5), (1, 2)) == (1, 2)
    assert [MPI.LAND(3, 0), MPI.LOR(0, []), MPI.BXOR(5, 3), MPI.REPLACE(1, 2), MPI.NO_OP(1, 2)] == [False, False, 6, 2, 1]
    inout = np.array([10, 20])
    MPI.PROD.Reduce_local(np.array([2, 3]), inout)
    assert inout.tolist() == [20, 60]
    flags = np.array([0, 5, 0], np.int16)
    MPI.LOR.Reduce_local(np.array([1, 0, 0], np.int16), flags)
    assert flags.tolist() == [1, 1, 0] and flags.dtype == np.int16
    assert (MPI.DOUBLE_INT.Get_size(), MPI.DOUBLE_INT.Get_extent(), MPI.SHORT_INT.size, MPI.TWOINT.extent) == (12, (0, 16), 6, 8)
    with pytest.raises(TypeError, match="unhashable"):
        hash(MPI.SUM)
    assert MPI.SUM == MPI.SUM and MPI.SUM != MPI.MAX and not MPI.OP_NULL and MPI.OP_NULL != MPI.SUM
    with pytest.raises(ValueError, match=r"^cannot call a null operation"):
        MPI.OP_NULL(1, 2)
    with pytest.raises(MPI.Exception, match=r"^Is_commutative: the operation is MPI.OP_NULL") as raised:
        MPI.OP_NULL.Is_commutative()
    assert raised.value.Get_error_code() == MPI.ERR_OP
    assert MPI.Op(MPI.SUM) == MPI.SUM and MPI.Op() == MPI.OP_NULL and MPI.OP_NULL.is_predefined
    twice = MPI.Op.Create(lambda a, b, datatype: None)
    twice.Free()
    with pytest.raises(MPI.Exception, match=r"^Op.Free: the operation is MPI.OP_NULL"):
        twice.Free()
    nan = np.array([(1.0, 0)], [("v", "f8"), ("i", "i4")])
    kept = np.array([(np.nan, 1)], nan.dtype)
    MPI.MAXLOC.Reduce_local(nan, kept)
    assert np.isnan(kept["v"][0]) and kept["i"][0] == 1  # (Open MPI keeps inoutbuf's unless inbuf's beats it)
    seen = []

    def scratch(inbuf, inoutbuf, datatype):  # (MPI's invec may be written as scratch)
        lower = np.frombuffer(inbuf, np.uint8)
        lower += 1
        np.frombuffer(inoutbuf, np.uint8)[:] += lower
        seen.append(datatype)

    mine, theirs = np.array([1, 2], np.uint8), np.array([10, 20], np.uint8)
    MPI.Op.Create(scratch).Reduce_local([mine, MPI.BYTE], [theirs, MPI.BYTE])
    MPI.Op.Create(scratch).Reduce_local(np.zeros(0, np.uint8), np.zeros(0, np.uint8))  # (not called: count 0)
    assert theirs.tolist() == [12, 23] and mine.tolist() == [1, 2] and seen == [MPI.BYTE]
    assert MPI.BOOL == MPI.C_BOOL and MPI.INT != MPI.INT32_T and MPI.COMPLEX != MPI.C_FLOAT_COMPLEX
    with pytest.raises(ValueError, match=r"^Reduce_local: mismatch in send and receive datatypes: the send "
                                         r"buffer holds float64, the receive buffer int32"):
        MPI.SUM.Reduce_local(np.zeros(2), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"^Reduce_local: mismatch in send count 3 and receive count 2"):
        MPI.BAND.Reduce_local(np.zeros(3, np.int32), np.zeros(2, np.int32))
    with pytest.raises(MPI.Exception, match=r"^Allreduce: MPI.SUM does not reduce a buffer of bool"):
        MPI.COMM_WORLD.Allreduce(np.zeros(2, bool), np.zeros(2, bool))
    with pytest.raises(TypeError, match=r"^Allreduce: op 'sum' is not an MPI.Op"):
        MPI.COMM_WORLD.Allreduce(np.zeros(1), np.zeros(1), op="sum")
    assert MPI.COMM_WORLD.allreduce(4, op=lambda x, y: x + y) == 4  # (a plain function, as before)
    with pytest.raises(TypeError, match=r"^Op.Create: 3 is not callable"):
        MPI.Op.Create(3)


def test_mpi4py_cartesian_grids_answer_as_open_mpi_does() -> None:
    """Create_cart, coordinates, ranks, shifts (PROC_NULL past the edge that does not wrap), Sub, Dup, a halo
    exchange along both dimensions, a ring, a grid smaller than the world: Open MPI 4.1's values for the same
    program. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(4), *python_program("mpi_cartesian.py")))
    assert sorted(by_rank) == [0, 1, 2, 3]
    coords = [[0, 0], [0, 1], [1, 0], [1, 1]]
    for r, out in by_rank.items():
        assert out["grid"] == ["Cartcomm", True, True, 2, [2, 2], [1, 0], coords[r], [[2, 2], [1, 0], coords[r]]]
        assert out["coords"] == coords and out["ranks"] == [2, 3, 3] and out["off_grid"] is True
        assert out["shifts"] == [[[2, 2], [-2, 1], [1, -2], [2, 2]], [[3, 3], [0, -2], [-2, 0], [3, 3]],
                                 [[0, 0], [-2, 3], [3, -2], [0, 0]], [[1, 1], [2, -2], [-2, 2], [1, 1]]][r]
        assert out["row"] == ["Cartcomm", 2, r % 2, [2], [0], [r % 2], [0, 1] if r < 2 else [2, 3]]
        assert out["halo"] == [[[2.0] * 2, [-1.0] * 2], [[3.0] * 2, [0.0] * 2], [[0.0] * 2, [-1.0] * 2],
                               [[1.0] * 2, [2.0] * 2]][r]
        assert out["ring"] == [[(r - 1) % 4, (r + 1) % 4], (r - 1) % 4]
        assert out["three"] == (True if r == 3 else [3, [r]])
        assert out["dup"] == ["Cartcomm", coords[r], 4] and out["too_large"] is True
    assert by_rank[3]["left_out"] is True  # (MPI.ERR_COMM; it was NotProvidedError)


def test_compute_dims_and_grid_arguments_as_open_mpi_takes_them() -> None:
    from popdist.mpi4py import MPI

    cases = {(4, 2): [2, 2], (12, 3): [3, 2, 2], (16, 3): [4, 2, 2], (7, 2): [7, 1], (1, 3): [1, 1, 1],
             (36, 4): [3, 3, 2, 2], (30, 3): [5, 3, 2], (64, 3): [4, 4, 4], (18, 2): [6, 3]}
    assert {args: MPI.Compute_dims(*args) for args in cases} == cases  # (Open MPI 4.1's answers)
    assert MPI.Compute_dims(12, [0, 3, 0]) == [2, 3, 2] and MPI.Compute_dims(12, [2, 0, 0]) == [2, 3, 2]
    assert MPI.Compute_dims(8, (0, 0)) == [4, 2] and MPI.Compute_dims(6, [2, 3]) == [2, 3]
    # (Open MPI 4.1 returns (6, [2, 2]) as it is, dividing 6 by each fixed dimension in turn; the standard, and
    # poprun-py, refuse a product that is not nnodes)
    for bad in [(6, [4, 0]), (0, 2), (24, 0), (-1, 2), (5, [2, 2]), (8, [2, 2]), (4, [1, 1]), (1, [1, 2]),
                (6, [2, 2])]:
        with pytest.raises(MPI.Exception) as raised:
            MPI.Compute_dims(*bad)
        assert raised.value.Get_error_code() == MPI.ERR_DIMS
    assert (MPI.ERR_OP, MPI.ERR_TOPOLOGY, MPI.ERR_DIMS, MPI.CART, MPI.GRAPH) == (10, 11, 12, 1, 2)  # (Open MPI's)
    import numpy as np

    wrapped = MPI.COMM_WORLD.Create_cart(np.array([1]), periods=True)  # (any sequence; one bool for all)
    assert wrapped.periods == [1] and isinstance(wrapped, MPI.Topocomm) and wrapped.neighbor_alltoall(None) == [None] * 2
    line = MPI.COMM_WORLD.Create_cart([1], periods=[False])
    assert line.Shift(0, 1) == (MPI.PROC_NULL, MPI.PROC_NULL) and line.Sub([False]).Get_topo() == ([], [], [])
    with pytest.raises(MPI.Exception, match=r"^Shift: direction 1 is not a dimension of this grid \(0 to 0\)"):
        line.Shift(1, 1)
    with pytest.raises(ValueError, match=r"^Create_cart: periods has 2 items, dims 1"):
        MPI.COMM_WORLD.Create_cart([1], periods=[True, False])
    with pytest.raises(MPI.Exception, match=r"^Create_cart: dims \[0\] is not a list of ints from 1"):
        MPI.COMM_WORLD.Create_cart([0])
    assert MPI.COMM_WORLD.Create_graph([], []) == MPI.COMM_NULL  # (a graph of no nodes leaves every rank out)


#: What Open MPI 4.1.4 with mpi4py 4.1.2 printed for ``mpi_neighbours.py`` (``mpirun -np 4``), rank by rank.
NEIGHBOURS_OPEN_MPI = [{'rank': 0,
      'edges': [[2, 2, -2, 1], [2, 2, -2, 1], [4, 4], 4, 4],
      'objects': [[20, 20, None, 10], ['2->1', '2->0', None, '1->2']],
      'before_wait': [2, 2, None, 1],
      'buffers': [[2, 20, 2, 20, -1, -1, 1, 10], [201, 200, -1, 102], [2, 20, 2, 20, -1, -1, 1, 10]],
      'test_after_barrier': True,
      'ring': ['3->right', '1->left'],
      'two': [['1->right', '1->left'], [1, 1]],
      'one': ['R', 'L']},
     {'rank': 1,
      'edges': [[3, 3, 0, -2], [3, 3, 0, -2], [4, 4], 4, 4],
      'objects': [[30, 30, 0, None], ['3->1', '3->0', '0->3', None]],
      'before_wait': [3, 3, 0, None],
      'buffers': [[3, 30, 3, 30, 0, 0, -1, -1], [301, 300, 3, -1], [3, 30, 3, 30, 0, 0, -1, -1]],
      'test_after_barrier': True,
      'ring': ['0->right', '2->left'],
      'two': [['0->right', '0->left'], [0, 0]]},
     {'rank': 2,
      'edges': [[0, 0, -2, 3], [0, 0, -2, 3], [4, 4], 4, 4],
      'objects': [[0, 0, None, 30], ['0->1', '0->0', None, '3->2']],
      'before_wait': [0, 0, None, 3],
      'buffers': [[0, 0, 0, 0, -1, -1, 3, 30], [1, 0, -1, 302], [0, 0, 0, 0, -1, -1, 3, 30]],
      'test_after_barrier': True,
      'ring': ['1->right', '3->left']},
     {'rank': 3,
      'edges': [[1, 1, 2, -2], [1, 1, 2, -2], [4, 4], 4, 4],
      'objects': [[10, 10, 20, None], ['1->1', '1->0', '2->3', None]],
      'before_wait': [1, 1, 2, None],
      'buffers': [[1, 10, 1, 10, 2, 20, -1, -1], [101, 100, 203, -1], [1, 10, 1, 10, 2, 20, -1, -1]],
      'test_after_barrier': True,
      'ring': ['2->right', '0->left']}]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_mpi4py_neighbour_collectives_give_what_open_mpi_gives(transport: str) -> None:
    """neighbor_allgather/alltoall and their buffer and nonblocking forms on a 2 x 2 grid, rings of 4, 2 and 1:
    rank by rank what Open MPI gave. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(4), f"--fabric-transport={transport}", *python_program("mpi_neighbours.py")))
    assert [{k: v for k, v in by_rank[r].items() if k != "size"} for r in range(4)] == NEIGHBOURS_OPEN_MPI


def test_mpi4py_neighbours_that_make_different_calls_are_named_on_every_rank() -> None:
    result = run_poprun(*job(3), *python_program("mpi_neighbours.py", "mismatch"))
    assert result.returncode != 0
    named = re.findall(r"CollectiveMismatchError: (neighbor_\w+): rank (\d) called (neighbor_\w+) where rank (\d) "
                       r"called (neighbor_\w+)", result.stderr.decode())
    assert named and all(mine == ours and mine != theirs and (theirs == "neighbor_allgather") == (rank == "0")
                         for mine, rank, theirs, _, ours in named)


#: What Open MPI 4.1.4 with mpi4py 4.1.2 printed for ``mpi_graphs.py`` (``mpirun -np 4``), rank by rank, but for
#: the order of a rank's sources in ``skips`` (made by ``Create_dist_graph``: unspecified by MPI; Open MPI's
#: follows the order the edges arrive in, which changed from run to run; poprun-py's is the order of the ranks
#: that gave them) and ``lopsided`` (Open MPI's waits forever).
GRAPHS_EXPECTED = [{'rank': 0,
      'adjacent': ['Distgraphcomm',
                   True,
                   [[3, 1, 3], [1, 3, 1], None],
                   [3, 3, False],
                   [3, 1, 3],
                   [1, 3, 1],
                   [3, 3],
                   True,
                   False],
      'parts': [[3, 1, 3], ['3#0', '1#1', '3#2'], [30, 11, 32], [30, 11, 32]],
      'weights': [[[3, 1, 3], [1, 3, 1], [[1, 2, 3], [4, 5, 6]]], [3, 3, True], [1, 1, False], [[], [], None], []],
      'star': [[[1, 2, 3], [1, 2, 3], None], [1, 2, 3]],
      'skips': [[[2, 3], [2, 1], None], [2, 3]],
      'whole': ['Graphcomm',
                True,
                [4, 6],
                [[2, 3, 4, 6], [1, 3, 0, 3, 0, 2]],
                [1, 3],
                2,
                4,
                6,
                [1, 3],
                2,
                [1, 3],
                [1, 3],
                ['1#0', '3#0']]},
     {'rank': 1,
      'adjacent': ['Distgraphcomm',
                   True,
                   [[0, 2, 0], [2, 0, 2], None],
                   [3, 3, False],
                   [0, 2, 0],
                   [2, 0, 2],
                   [3, 3],
                   True,
                   False],
      'parts': [[0, 2, 0], ['0#0', '2#1', '0#2'], [0, 21, 2], [0, 21, 2]],
      'weights': [[[0, 2, 0], [2, 0, 2], [[1, 2, 3], [4, 5, 6]]], [3, 3, True], [1, 1, False], [[], [], None], []],
      'star': [[[0], [0], None], [0]],
      'skips': [[[0, 3], [3, 2], None], [0, 3]],
      'whole': ['Graphcomm',
                True,
                [4, 6],
                [[2, 3, 4, 6], [1, 3, 0, 3, 0, 2]],
                [0],
                1,
                4,
                6,
                [0],
                1,
                [0],
                [0],
                ['0#0']]},
     {'rank': 2,
      'adjacent': ['Distgraphcomm',
                   True,
                   [[1, 3, 1], [3, 1, 3], None],
                   [3, 3, False],
                   [1, 3, 1],
                   [3, 1, 3],
                   [3, 3],
                   True,
                   False],
      'parts': [[1, 3, 1], ['1#0', '3#1', '1#2'], [10, 31, 12], [10, 31, 12]],
      'weights': [[[1, 3, 1], [3, 1, 3], [[1, 2, 3], [4, 5, 6]]], [3, 3, True], [1, 1, False], [[], [], None], []],
      'star': [[[0], [0], None], [0]],
      'skips': [[[0, 1], [0, 3], None], [0, 1]],
      'whole': ['Graphcomm',
                True,
                [4, 6],
                [[2, 3, 4, 6], [1, 3, 0, 3, 0, 2]],
                [3],
                1,
                4,
                6,
                [3],
                1,
                [3],
                [3],
                ['3#1']]},
     {'rank': 3,
      'adjacent': ['Distgraphcomm',
                   True,
                   [[2, 0, 2], [0, 2, 0], None],
                   [3, 3, False],
                   [2, 0, 2],
                   [0, 2, 0],
                   [3, 3],
                   True,
                   False],
      'parts': [[2, 0, 2], ['2#0', '0#1', '2#2'], [20, 1, 22], [20, 1, 22]],
      'weights': [[[2, 0, 2], [0, 2, 0], [[1, 2, 3], [4, 5, 6]]], [3, 3, True], [1, 1, False], [[], [], None], []],
      'star': [[[0], [0], None], [0]],
      'skips': [[[1, 2], [1, 0], None], [1, 2]],
      'whole': ['Graphcomm',
                True,
                [4, 6],
                [[2, 3, 4, 6], [1, 3, 0, 3, 0, 2]],
                [0, 2],
                2,
                4,
                6,
                [0, 2],
                2,
                [0, 2],
                [0, 2],
                ['0#1', '2#0']]}]


def test_mpi4py_graph_topologies_give_what_open_mpi_gives() -> None:
    """Create_dist_graph_adjacent (a multigraph, weights, empty), Create_dist_graph, Create_graph and their
    neighbour collectives; a graph whose ranks disagree raises on every rank. Before: NotProvidedError."""
    by_rank = records(run_poprun(*job(4), *python_program("mpi_graphs.py")))
    assert [{k: v for k, v in by_rank[r].items() if k not in ("size", "lopsided")} for r in range(4)] == GRAPHS_EXPECTED
    for out in by_rank.values():
        assert out["lopsided"] == [True, "neighbor_allgather: rank 0 lists rank 1 as a destination 1 time(s), rank 1 "
                                   "lists rank 0 as a source 0 time(s), so a neighbour's part would never come "
                                   "(MPI_ERR_TOPOLOGY)"]
