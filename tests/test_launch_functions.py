"""poprun_py.launch: functions in forked instances with the full PopDist environment, shared fate, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import popdist
import popdist.collectives as C
import poprun_py
from popdist.env import OMPI_RANK, OMPI_SIZE, TORCH_RANK, TORCH_WORLD_SIZE
from poprun_py import InstancesFailed
from support import RUN_TIMEOUT, python_program, read_line


def where_am_i(scale: int, offset: int = 0) -> tuple[int, int, int]:
    return popdist.getInstanceIndex(), popdist.getNumInstances(), popdist.getInstanceIndex() * scale + offset


def test_results_come_back_in_instance_order_with_args_and_kwargs() -> None:
    assert poprun_py.launch(where_am_i, 10, offset=1, num_instances=4) == [(i, 4, 10 * i + 1) for i in range(4)]


def test_closures_lambdas_and_local_functions_run_without_pickling() -> None:
    lock = __import__("threading").Lock()  # unpicklable: a fork inherits it, nothing is sent

    def local(extra: int) -> int:
        with lock:
            return popdist.getInstanceIndex() + extra

    assert poprun_py.launch(local, 100, num_instances=3) == [100, 101, 102]
    assert poprun_py.launch(lambda: popdist.getInstanceIndex() ** 2, num_instances=3) == [0, 1, 4]
    assert poprun_py.launch(lambda: np.arange(3) * popdist.getInstanceIndex(), num_instances=2)[1].tolist() == [0, 1, 2]


def test_each_instance_has_the_environment_poprun_gives() -> None:
    def environment() -> dict:
        return {
            "index": popdist.getInstanceIndex(), "instances": popdist.getNumInstances(),
            "local_replicas": popdist.getNumLocalReplicas(), "total": popdist.getNumTotalReplicas(),
            "offset": popdist.getReplicaIndexOffset(), "ipus": popdist.getNumIpusPerReplica(),
            "set": popdist.isPopdistEnvSet(), "ompi": (os.environ[OMPI_RANK], os.environ[OMPI_SIZE]),
            "torch": (os.environ[TORCH_RANK], os.environ[TORCH_WORLD_SIZE]), "pid": os.getpid(),
            "session": os.getsid(0),
        }

    results = poprun_py.launch(environment, num_instances=2, num_replicas=8, ipus_per_replica=2)
    for index, env in enumerate(results):
        assert env["index"] == index and env["instances"] == 2 and env["set"]
        assert (env["local_replicas"], env["total"], env["offset"], env["ipus"]) == (4, 8, 4 * index, 2)
        assert env["ompi"] == env["torch"] == (str(index), "2")
        assert env["session"] == env["pid"] != os.getpid()  # a session of its own, as under poprun
    assert not popdist.isPopdistEnvSet()  # the caller's environment is untouched


def test_collectives_work_inside() -> None:
    def reduce() -> list:
        index = popdist.getInstanceIndex()
        total = C.allreduce(np.full(3, index + 1, np.float32))
        root = C.broadcast(np.array([index * 7]), root=2)
        gathered = C.allgather(np.array([index]))
        C.barrier()
        return [total.tolist(), root.tolist(), gathered.ravel().tolist()]

    results = poprun_py.launch(reduce, num_instances=4)
    assert results == [[[10.0] * 3, [14], [0, 1, 2, 3]]] * 4


def test_the_callers_popdist_state_does_not_leak_into_the_instances() -> None:
    popdist.init()  # the caller alone: a one-instance fabric, which a fork must not inherit
    try:
        assert poprun_py.launch(lambda: C.allreduce(np.ones(1))[0], num_instances=3) == [3.0] * 3
        assert C.allreduce(np.ones(1))[0] == 1.0
    finally:
        popdist.finalizeBackend()


def test_output_reaches_the_caller_tagged(capfd: pytest.CaptureFixture[str]) -> None:
    def talk() -> None:
        print(f"hello from {popdist.getInstanceIndex()}")
        print("to stderr", file=sys.stderr)

    poprun_py.launch(talk, num_instances=2)
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == ["[1,0]<stdout>:hello from 0", "[1,1]<stdout>:hello from 1"]
    assert sorted(err.splitlines()) == ["[1,0]<stderr>:to stderr", "[1,1]<stderr>:to stderr"]


def fail_on(index: int) -> None:
    if popdist.getInstanceIndex() == index:
        raise ValueError(f"instance {index} broke on purpose")
    time.sleep(RUN_TIMEOUT)  # the others must be stopped, not waited for


def test_a_failure_stops_the_others_and_carries_its_traceback() -> None:
    with pytest.raises(InstancesFailed) as caught:
        poprun_py.launch(fail_on, 2, num_instances=4)
    failed = caught.value
    assert [f.index for f in failed.failures] == [2] and failed.stopped == (0, 1, 3)
    first = failed.first
    assert first is not None and first.error is not None
    assert first.error.type_name == "ValueError" and first.error.message == "instance 2 broke on purpose"
    assert 'raise ValueError(f"instance {index} broke on purpose")' in first.error.traceback
    assert "in fail_on" in first.error.traceback and "_run" not in first.error.traceback
    message = str(failed)
    assert message.splitlines()[0].startswith("instance 2 of 4 raised ValueError: instance 2 broke on purpose (pid ")
    assert "stopped as a consequence: instances 0, 1, 3" in message


def first_fails_then_another_on_sigterm() -> None:
    index = popdist.getInstanceIndex()
    if index == 3:
        def stopped(signum, frame):
            raise RuntimeError("failed while being stopped")
        signal.signal(signal.SIGTERM, stopped)
    C.barrier()  # instance 3's handler is in place before anything fails
    if index == 1:
        raise KeyError("the root cause")
    time.sleep(RUN_TIMEOUT)


def test_every_failure_is_listed_the_first_first_and_the_stopped_apart() -> None:
    with pytest.raises(InstancesFailed) as caught:
        poprun_py.launch(first_fails_then_another_on_sigterm, num_instances=4)
    failed = caught.value
    assert [(f.index, f.error.type_name) for f in failed.failures if f.error] == [(1, "KeyError"), (3, "RuntimeError")]
    assert failed.stopped == (0, 2)
    message = str(failed)
    assert message.index("the root cause") < message.index("failed while being stopped")
    assert "def stopped(signum, frame)" not in message and 'raise RuntimeError("failed while being stopped")' in message


@pytest.mark.parametrize("how,words", [
    (lambda: os._exit(3), "exited with code 3"),
    (lambda: os.kill(os.getpid(), signal.SIGKILL), "was killed by SIGKILL"),
    (lambda: sys.exit("bye"), "raised SystemExit: bye"),
    (lambda: os._exit(0), "exited with code 0 before returning a result"),
])
def test_instances_that_end_without_an_exception_are_named(how, words: str) -> None:
    def body() -> None:
        if popdist.getInstanceIndex() == 1:
            how()
        time.sleep(0 if "code 0" in words else RUN_TIMEOUT)

    with pytest.raises(InstancesFailed) as caught:
        poprun_py.launch(body, num_instances=2)
    assert [f.index for f in caught.value.failures] == [1] and words in caught.value.failures[0].how


def test_sys_exit_0_counts_as_returning_none() -> None:
    assert poprun_py.launch(lambda: sys.exit(0), num_instances=2) == [None, None]


def forks_a_child_that(ends: str) -> tuple[int, list[float]]:
    C.allreduce(np.ones(1))
    pid = os.fork()
    if pid == 0:  # the child leaves the function, each way a function can
        if ends == "exits":
            sys.exit(5)
        if ends == "raises":
            raise RuntimeError("the child's own error")
        return -1, []
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), C.allreduce(np.ones(1)).tolist()


def test_a_process_the_function_forks_is_not_the_instance(capfd: pytest.CaptureFixture[str]) -> None:
    """The child's exit, error or result is its own (its code, its traceback on stderr), the instance's result
    is the instance's, and the instance's fabric works on. Before, the child's outcome, written first, was the
    instance's: a child's sys.exit(5) made the result None, its return value the instance's."""
    for ends, code in (("exits", 5), ("raises", 1), ("returns", 0)):
        assert poprun_py.launch(forks_a_child_that, ends, num_instances=2) == [(code, [2.0])] * 2, ends
    err = capfd.readouterr().err
    assert err.count("RuntimeError: the child's own error") == 2 and err.count('in forks_a_child_that') == 2, err


def test_a_result_that_cannot_be_pickled_is_a_failure_with_a_reason() -> None:
    with pytest.raises(InstancesFailed, match="cannot be sent back"):
        poprun_py.launch(lambda: (lambda: None), num_instances=1)


def hang_in_here() -> None:
    time.sleep(RUN_TIMEOUT)


def hang_on_one() -> None:
    if popdist.getInstanceIndex() == 1:
        subprocess.Popen(["sleep", str(RUN_TIMEOUT)])  # a child of its own: stopped with it
        hang_in_here()
    C.barrier()


def test_a_time_limit_dumps_the_stacks_of_the_hung_instances() -> None:
    with pytest.raises(InstancesFailed) as caught:
        poprun_py.launch(hang_on_one, num_instances=3, timeout=2)
    failed = caught.value
    assert failed.timed_out == 2 and [f.index for f in failed.failures] == [0, 1, 2]
    stacks = {f.index: f.stacks or "" for f in failed.failures}
    assert "in hang_in_here" in stacks[1] and "in hang_on_one" in stacks[1]
    assert "in barrier" in stacks[0] and "in barrier" in stacks[2]  # waiting for instance 1
    assert "_run_child" not in stacks[1]  # the launcher's frames below the function are cut
    assert str(failed).startswith("timed out after 2s; the stacks of the instances still running (0-2) follow")


@pytest.mark.parametrize("call,error,words", [
    (lambda: poprun_py.launch(print, num_instances=0), ValueError, "num_instances must be at least 1, got 0"),
    (lambda: poprun_py.launch(print, num_instances=2, num_replicas=3), ValueError, "cannot be divided evenly"),
    (lambda: poprun_py.launch(print, num_instances="2"), TypeError, "num_instances must be a whole number"),
    (lambda: poprun_py.launch(print, timeout=0), ValueError, "timeout must be more than 0 seconds"),
    (lambda: poprun_py.launch(print, timeout=float("inf")), ValueError, "at most 1000000, got inf"),
    (lambda: poprun_py.launch(42), TypeError, "needs a callable"),
    (lambda: poprun_py.launch(print, num_instances=10**7), ValueError,
     "num_replicas=10000000 x ipus_per_replica=1 is 10000000 IPUs; at most 1048576"),
    (lambda: poprun_py.launch(print, num_instances=2, ipus_per_replica=3, offline=False), ValueError,
     "num_replicas=2 x ipus_per_replica=3 is 6 IPUs; ask for 1, 2, 4, 8, ... IPUs, or use offline=True"),
])
def test_bad_input_is_one_clear_error(call, error: type, words: str) -> None:
    with pytest.raises(error) as caught:
        call()
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_with_simulated_ipus_each_instance_gets_its_device() -> None:
    def device() -> tuple[int, str]:
        return popdist.getDeviceId(), os.environ["IPUOF_VIPU_API_PARTITION_ID"]

    results = poprun_py.launch(device, num_instances=2, num_replicas=4, offline=False)
    assert [r[0] for r in results] == [4, 5]  # a 4-IPU partition, 2 IPUs per instance: 2N - 2N/S + i
    assert results[0][1] == results[1][1] != "offline"


def test_instances_die_with_the_caller_even_on_sigkill() -> None:
    caller = subprocess.Popen(python_program("launch_and_wait.py", "3"), stdout=subprocess.PIPE)
    try:
        pids = [int(read_line(caller.stdout).split()[-1]) for _ in range(3)]
        instances = [psutil.Process(pid) for pid in pids]
        caller.kill()
        caller.wait(RUN_TIMEOUT)
        _, alive = psutil.wait_procs(instances, timeout=RUN_TIMEOUT)
        assert not alive
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
