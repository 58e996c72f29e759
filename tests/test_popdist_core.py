"""The camelCase PopDist API: defaults outside poprun, values under a launch."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import popdist
import popdist.core
import popdist.popdist_core
from popdist import env
from popdist.env import CONTRACT_NAMES, InstanceEnv, target_options_for
from simipu.hardware import parent_device_id
from support import python_program, run_poprun

API = popdist.core.__all__


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No contract variable from the outer environment, and no backend left initialised."""
    for name in CONTRACT_NAMES:
        monkeypatch.delenv(name, raising=False)
    popdist.finalizeBackend()
    yield
    popdist.finalizeBackend()


def launch(monkeypatch: pytest.MonkeyPatch, total: int, ipus: int, instances: int,
           index: int, hosts: int = 1) -> InstanceEnv:
    local = total // instances
    per_host = instances // hosts
    inst = InstanceEnv(
        num_total_replicas=total, num_ipus_per_replica=ipus, num_local_replicas=local,
        replica_index_offset=index * local, local_instance_index=index % per_host,
        num_local_instances=per_host, node_device_id=parent_device_id(total * ipus),
        vipu_host="localhost", vipu_port=8090, vipu_partition="p", vipu_timeout=10,
        target_options=target_options_for(total * ipus, 1, local * ipus, False),
    )
    for name, value in inst.render().items():
        monkeypatch.setenv(name, value)
    return inst


def test_defaults_outside_poprun() -> None:
    assert popdist.isPopdistEnvSet() is False
    assert popdist.isUniformReplicasPerInstance() is True
    assert popdist.getNumTotalReplicas() == 1
    assert popdist.getNumIpusPerReplica() == 1
    assert popdist.getNumLocalReplicas() == 1
    assert popdist.getReplicaIndexOffset() == 0
    assert popdist.getInstanceIndex() == 0
    assert popdist.getNumInstances() == 1
    assert popdist.getLocalInstanceIndex() == 0
    assert popdist.checkNumIpusPerReplica(1) is True
    assert popdist.checkNumIpusPerReplica(2) is False
    assert popdist.isBackendInitialized() is False


@pytest.mark.parametrize(("ipus", "expected"), [(None, 0), (0, 0), (1, 0), (2, 2), (4, 6), (16, 30)])
def test_device_id_outside_poprun_is_one_replica(ipus: int | None, expected: int) -> None:
    assert popdist.getDeviceId(ipus) == expected
    assert popdist.getDeviceId(ipusPerReplica=ipus) == expected


@pytest.mark.parametrize("index", range(4))
def test_values_under_a_launch(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    launch(monkeypatch, total=8, ipus=2, instances=4, index=index, hosts=2)
    assert popdist.isPopdistEnvSet() is True
    assert popdist.isUniformReplicasPerInstance() is True
    assert popdist.getNumTotalReplicas() == 8
    assert popdist.getNumIpusPerReplica() == 2
    assert popdist.getNumLocalReplicas() == 2
    assert popdist.getReplicaIndexOffset() == 2 * index
    assert popdist.getInstanceIndex() == index
    assert popdist.getNumInstances() == 4
    assert popdist.getLocalInstanceIndex() == index % 2
    assert popdist.checkNumIpusPerReplica(2) is True
    assert popdist.checkNumIpusPerReplica(1) is False
    expected = [24, 25, 26, 27][index]
    assert popdist.getDeviceId() == expected
    assert popdist.getDeviceId(2) == expected
    assert popdist.getDeviceId(ipusPerReplica=0) == expected


def test_device_id_single_instance_of_a_4_ipu_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=4, ipus=1, instances=1, index=0)
    assert popdist.getDeviceId() == 6


def test_device_id_64_replicas_one_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=64, ipus=1, instances=1, index=0)
    assert popdist.getDeviceId() == 126


def test_env_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert popdist.getNumInstances() == 1
    launch(monkeypatch, total=8, ipus=1, instances=4, index=3)
    assert popdist.getInstanceIndex() == 3
    monkeypatch.delenv(env.TOTAL_REPLICAS)
    assert popdist.getInstanceIndex() == 0


def test_device_id_mismatch_names_both_values(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=8, ipus=2, instances=4, index=1)
    with pytest.raises(ValueError, match=r"ipus_per_replica=4.*2 IPUs per replica"):
        popdist.getDeviceId(4)
    with pytest.raises(ValueError, match="ipus_per_replica=1"):
        popdist.getDeviceId(ipusPerReplica=1)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_device_id_rejects_bad_argument(bad: object) -> None:
    with pytest.raises(ValueError):
        popdist.getDeviceId(bad)  # type: ignore[arg-type]


def test_device_id_rejects_both_spellings() -> None:
    with pytest.raises(TypeError):
        popdist.getDeviceId(1, ipusPerReplica=1)


def test_malformed_environment_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=8, ipus=1, instances=4, index=0)
    monkeypatch.setenv(env.LOCAL_REPLICAS, "two")
    with pytest.raises(ValueError, match=env.LOCAL_REPLICAS):
        popdist.getNumLocalReplicas()
    with pytest.raises(ValueError, match=env.LOCAL_REPLICAS):
        popdist.init()
    assert popdist.isBackendInitialized() is False


def test_non_uniform_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=8, ipus=1, instances=4, index=0)
    monkeypatch.setenv(env.UNIFORM_REPLICAS, "0")
    assert popdist.isUniformReplicasPerInstance() is False
    assert popdist.isPopdistEnvSet() is True  # (a yes or no: it raised with the getters before)
    with pytest.raises(ValueError, match=env.UNIFORM_REPLICAS):
        popdist.getInstanceIndex()


def test_init_twice_raises_then_finalize_allows_init() -> None:
    popdist.init()
    assert popdist.isBackendInitialized() is True
    with pytest.raises(RuntimeError, match="already initialised"):
        popdist.init()
    popdist.finalizeBackend()
    assert popdist.isBackendInitialized() is False
    popdist.finalizeBackend()  # a no-op when not initialised
    popdist.init()
    assert popdist.isBackendInitialized() is True


def test_init_after_the_first_collective_finds_it_done() -> None:
    """The first collective (or hvd's, or ``import mpi4py``) initialises PopDist; the program's own init()
    after it is then the one Graphcore's PopDist expects, not a second (it raised before)."""
    import popdist.collectives

    popdist.finalizeBackend()
    assert popdist.collectives.allreduce(np.ones(2)).tolist() == [1.0, 1.0]
    popdist.init()
    assert popdist.isBackendInitialized() is True
    with pytest.raises(RuntimeError, match="already initialised"):
        popdist.init()
    popdist.finalizeBackend()


def test_init_under_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    launch(monkeypatch, total=8, ipus=1, instances=4, index=2)
    popdist.init()
    assert popdist.isBackendInitialized() is True


def test_concurrent_init_succeeds_exactly_once() -> None:
    barrier = threading.Barrier(16)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        try:
            popdist.init()
            result = "ok"
        except RuntimeError:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=attempt) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * 15


@pytest.mark.parametrize("name", API)
def test_every_path_exposes_the_same_function(name: str) -> None:
    assert getattr(popdist, name) is getattr(popdist.core, name)
    assert getattr(popdist.popdist_core, name) is getattr(popdist.core, name)


def test_guide_functions_are_all_present() -> None:
    guide = {"checkNumIpusPerReplica", "getDeviceId", "getInstanceIndex", "getNumInstances",
             "getNumIpusPerReplica", "getNumLocalReplicas", "getNumTotalReplicas",
             "getReplicaIndexOffset", "isPopdistEnvSet", "isUniformReplicasPerInstance"}
    assert guide <= set(popdist.popdist_core.__all__)


def test_import_does_not_load_numpy() -> None:
    src = str(Path(popdist.__file__).resolve().parents[1])
    code = "import sys, popdist; assert 'numpy' not in sys.modules, 'numpy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": src})


def test_a_fork_starts_uninitialised_and_leaves_the_parents_fabric_alone() -> None:
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
                        *python_program("fork_after_init.py"))
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(result.stdout.decode().splitlines()) == ["0 3 0", "1 3 0"]


def test_a_collective_in_a_forked_child_fails_at_once_saying_why() -> None:
    """Before, the child checked in with the rendezvous as its parent's instance: "RendezvousError refused by
    the job's rendezvous: instance 1 has already checked in", and poprun warned of a refused connection."""
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
                        *python_program("collective_in_fork.py"))
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    for index in (0, 1):
        pid = next(line.split()[2] for line in lines if line.startswith(f"{index} parent "))
        assert f"{index} parent {pid} 2" in lines
        assert (f"{index} child ForkedProcessError: collectives cannot be used in a process forked from instance "
                f"{index} (pid {pid}): call them from the instance's own process") in lines
    assert b"refused" not in result.stderr, result.stderr.decode()


def test_launch_in_a_poprun_instance_joins_its_own_fabric() -> None:
    """launch()'s instances are forks of the caller, here an instance of a poprun job: with an environment of
    their own job, they are not refused as forks of it."""
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
                        *python_program("launch_in_instance.py"))
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(result.stdout.decode().splitlines()) == ["0 [6, 6, 6] 2", "1 [6, 6, 6] 2"]
