"""popdist.Options: PopTorch's setters, the launch's values under poprun, your own launcher without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import popdist
from popdist.data import Sharding
from popdist.env import CONTRACT_NAMES, OMPI_RANK, OMPI_SIZE, InstanceEnv, target_options_for
from popdist.options import LaunchConflict, ReplicaSettings
from simipu.hardware import parent_device_id
from support import RUN_TIMEOUT, program


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in CONTRACT_NAMES:
        monkeypatch.delenv(name, raising=False)
    yield


def launch(monkeypatch: pytest.MonkeyPatch, total: int, instances: int, index: int, ipus: int = 1) -> None:
    local = total // instances
    inst = InstanceEnv(
        num_total_replicas=total, num_ipus_per_replica=ipus, num_local_replicas=local,
        replica_index_offset=index * local, local_instance_index=index, num_local_instances=instances,
        node_device_id=parent_device_id(total * ipus), vipu_host="localhost", vipu_port=8090,
        vipu_partition="p", vipu_timeout=10, target_options=target_options_for(total * ipus, 1, local * ipus, False),
    )
    for name, value in inst.render().items():
        monkeypatch.setenv(name, value)


def test_defaults_and_setters_outside_poprun() -> None:
    options = popdist.Options()
    assert options.settings() == ReplicaSettings()
    same = (options.replicationFactor(4).deviceIterations(3).randomSeed(9))
    assert same is options and options.Training.gradientAccumulation(2) is options.Training
    assert options.Distributed.configureProcessId(1, 3) is options.Distributed
    assert options.settings() == ReplicaSettings(4, 3, 2, 9, 1, 3)
    assert (options.total_replicas, options.settings().replica_offset) == (12, 4)
    assert "replicationFactor=4" in repr(options)


@pytest.mark.parametrize("call,message", [
    (lambda o: o.replicationFactor(0), "replicationFactor must be an integer >= 1"),
    (lambda o: o.deviceIterations(True), "deviceIterations must be an integer >= 1"),
    (lambda o: o.Training.gradientAccumulation(1.5), "gradientAccumulation must be an integer >= 1"),
    (lambda o: o.randomSeed(-1), "randomSeed must be an integer"),
    (lambda o: o.Distributed.configureProcessId(2, 2), r"process_id must be an integer in \[0, 2\)"),
    (lambda o: o.Distributed.configureProcessId(0, 0), "num_processes must be an integer >= 1"),
])
def test_bad_values_say_what_is_allowed(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(popdist.Options())


def test_open_mpi_variables_are_read_by_default_as_poptorch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OMPI_SIZE, "4")
    monkeypatch.setenv(OMPI_RANK, "3")
    distributed = popdist.Options().Distributed
    assert (distributed.processId, distributed.numProcesses) == (3, 4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert distributed.setEnvVarNames("WORLD_SIZE", "RANK").processId == 1 and distributed.numProcesses == 2


def test_under_poprun_the_launch_decides_replicas_and_process(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=8, instances=2, index=1)
    options = popdist.Options(ipus_per_replica=1).randomSeed(5).deviceIterations(2)
    assert options.replication_factor == 4 and options.total_replicas == 8
    assert (options.Distributed.processId, options.Distributed.numProcesses) == (1, 2)
    options.replicationFactor(4).Distributed.configureProcessId(1, 2)  # agreeing with the launch is fine
    assert options.settings() == ReplicaSettings(4, 2, 1, 5, 1, 2)


@pytest.mark.parametrize("call,flag", [
    (lambda o: o.replicationFactor(2), "--num-replicas 4"),
    (lambda o: o.Distributed.configureProcessId(0, 4), "--num-instances 4"),
    (lambda o: o.Distributed.configureProcessId(0, 2), "drop the call"),
    (lambda o: o.Distributed.setEnvVarNames("NOT_SET_SIZE", "NOT_SET_RANK"), "instance 1 of 2"),
])
def test_under_poprun_a_contradicting_setter_says_which_option_to_change(
        monkeypatch: pytest.MonkeyPatch, call, flag: str) -> None:
    launch(monkeypatch, total=8, instances=2, index=1)
    options = popdist.Options()
    with pytest.raises(LaunchConflict, match=flag):
        call(options)
    assert options.replication_factor == 4 and options.Distributed.processId == 1  # unchanged


def test_under_poprun_ipus_per_replica_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=4, instances=2, index=0, ipus=2)
    assert popdist.Options(ipus_per_replica=2).ipus_per_replica == 2
    with pytest.raises(LaunchConflict, match="--ipus-per-replica 4"):
        popdist.Options(ipus_per_replica=4)


def run_workers(argvs: list[list[str]], envs: list[dict[str, str]]) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, program("own_launcher_worker.py"), *argv],
                              stdout=subprocess.PIPE, env={**os.environ, **env}) for argv, env in zip(argvs, envs)]
    try:
        outputs = [proc.communicate(timeout=RUN_TIMEOUT)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert all(proc.returncode == 0 for proc in procs)
    return [json.loads(out) for out in outputs]


@pytest.mark.parametrize("style", ["configureProcessId", "open-mpi-variables"])
def test_your_own_launcher_gives_each_process_its_own_shard(style: str) -> None:
    if style == "configureProcessId":
        reports = run_workers([["0", "2"], ["1", "2"]], [{}, {}])
    else:
        reports = run_workers([[], []], [{OMPI_RANK: str(i), OMPI_SIZE: "2"} for i in range(2)])
    assert [(r["process"], r["processes"]) for r in reports] == [(0, 2), (1, 2)]
    expected = [Sharding(100, 3, ReplicaSettings(2, random_seed=42, process_id=i, num_processes=2),
                         shuffle=True, drop_last=False).indices(0) for i in range(2)]
    for report, want in zip(reports, expected):
        assert report["items"] == [[rows.tolist() for rows in item] for item in want]
    seen = [i for r in reports for item in r["items"] for batch in item for i in batch]
    assert sorted(seen) == list(range(100))  # disjoint shards covering the dataset
