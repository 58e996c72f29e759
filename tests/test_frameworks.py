"""popdist.poptorch, popdist.popart and popdist.tensorflow (guide 4.2.2-4.2.4), run through the real poprun."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from popdist.env import CONTRACT_NAMES
from support import PROGRAMS, python_program, run_poprun

STAND_INS = PROGRAMS / "stand_ins"
BLOCKED = ("useIpuId", "replicationFactor", "Distributed.disable", "Distributed.setEnvVarNames",
           "Distributed.configureProcessId")


def reports(result) -> list[dict]:
    assert result.returncode == 0, result.stderr.decode()
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("frameworks: ")]
    found = sorted((json.loads(line.split(": ", 1)[1]) for line in lines), key=lambda r: r["instance"])
    assert found, result.stdout.decode() + result.stderr.decode()
    return found


def test_hello_poprun_shape_on_a_partition() -> None:
    """8 replicas x 4 instances x 2 IPUs per replica on the embedded V-IPU: offsets 0, 2, 4, 6; devices 24-27."""
    found = reports(run_poprun("--num-replicas", "8", "--num-instances", "4", "--ipus-per-replica", "2",
                               *python_program("frameworks_check.py", "--ipus-per-replica", "2")))
    assert [r["instance"] for r in found] == [0, 1, 2, 3]
    for index, r in enumerate(found):
        assert r["offset"] == 2 * index
        assert r["replication_factor"] == 2 and r["process"] == [index, 4]
        assert r["device_id"] == 24 + index
        assert r["session"] == {"enableReplicatedGraphs": True, "replicatedGraphCount": 2,
                                "enableDistributedReplicatedGraphs": True, "globalReplicaOffset": 2 * index,
                                "globalReplicationFactor": 8}
        # the 4 IPUs poprun attached for this instance; after a detach, getDevice attaches them again (it
        # returned a detached device before)
        assert r["popart_device"] == [24 + index, 4, True, False, True]
        assert r["tensorflow"] == [[24 + index], 4, index]
    # popdist.data.DataLoader reads these options: the 8 replicas' first batches tile 16 distinct samples
    batches = [row for r in found for batch in r["first_batches"] for row in batch]
    assert sorted(batches) == list(range(16))


def test_offline_launch_attaches_nothing() -> None:
    found = reports(run_poprun("--offline-mode=1", "--num-replicas", "2", "--num-instances", "2",
                               *python_program("frameworks_check.py")))
    for index, r in enumerate(found):
        assert r["device_id"] is None and r["process"] == [index, 2] and r["replication_factor"] == 1
        assert r["popart_device"][2] is False and r["popart_device"][4] is False


def test_blocked_setters_raise_graphcore_messages_under_poprun() -> None:
    found = reports(run_poprun("--offline-mode=1", "--num-replicas", "4", "--num-instances", "2",
                               *python_program("frameworks_check.py", "--blocked")))
    for r in found:
        for name in BLOCKED:
            assert r["blocked"][name] is not None, name
            assert r["blocked"][name].startswith(f"Cannot call `{name}` with popdist.poptorch.Options"), r["blocked"]
        assert r["replication_factor"] == 2  # a blocked call changed nothing


def test_random_seed_also_seeds_torch() -> None:
    """Two instances seeding through the options draw the same numbers (a ported example diverged without it)."""
    pytest.importorskip("torch", reason="torch is the 'torch' extra (scripts/test.sh installs it)")
    found = reports(run_poprun("--offline-mode=1", "--num-replicas", "2", "--num-instances", "2",
                               *python_program("frameworks_check.py", "--seed", "1234")))
    assert found[0]["torch_random"] == found[1]["torch_random"]
    import torch

    torch.manual_seed(1234)
    assert found[0]["torch_random"] == torch.rand(3).tolist()


def test_outside_poprun_the_process_is_0_of_1(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*CONTRACT_NAMES, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")  # read by popdist.Options, not by the launch-bound options
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    import popdist.poptorch

    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    assert opts.replication_factor == 1 and opts.device_id is None
    with pytest.raises(RuntimeError, match=r"Cannot call `Distributed\.configureProcessId` with popdist\.poptorch"):
        opts.Distributed.configureProcessId(1)
    assert type(opts).__name__ == "Options" and isinstance(opts, popdist.Options)
    assert isinstance(popdist.poptorch.Options(), popdist.Options) and popdist.poptorch.Options(1).ipus_per_replica == 1
    # a PopTorch setter these options lack says why (a bare AttributeError before); hasattr stays False
    with pytest.raises(AttributeError, match=r"has no 'enableExecutableCaching' here: PopTorch is not installed"):
        opts.enableExecutableCaching("cache")
    assert not hasattr(opts, "showCompilationProgressBar")


def test_popart_options_outside_poprun_are_one_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTRACT_NAMES:
        monkeypatch.delenv(name, raising=False)
    import popdist.popart
    import popdist.tensorflow

    session = types.SimpleNamespace()
    popdist.popart.configureSessionOptions(session)
    assert vars(session) == {"enableReplicatedGraphs": False, "replicatedGraphCount": 1,
                             "enableDistributedReplicatedGraphs": False, "globalReplicaOffset": 0,
                             "globalReplicationFactor": 1}
    device = popdist.popart.getDevice()
    assert (device.id, device.numIpus, device.isAttached) == (0, 1, False)
    assert popdist.popart.getDevice(2).id == 2  # the first 2-IPU group of a 2-IPU system
    with pytest.raises(TypeError, match="needs an IPUConfig"):
        popdist.tensorflow.set_ipu_config(object())


def test_with_poptorch_installed_the_options_are_a_real_subclass() -> None:
    """PopTorch needs the Poplar SDK, so a stand-in with PopTorch's option names plays it (tests/programs/stand_ins).
    The options pickle, and popdist.data.DataLoader takes them before any randomSeed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STAND_INS), os.environ.get("PYTHONPATH", "")])}
    result = run_poprun("--offline-mode=1", "--num-replicas", "4", "--num-instances", "2", sys.executable, "-c",
                        "import poptorch, popdist.poptorch as p, json; o = p.Options(); "
                        "blocked = []\n"
                        "for call in (lambda: o.useIpuId(0), lambda: o.replicationFactor(1), "
                        "lambda: o.Distributed.configureProcessId(1)):\n"
                        "    try: call()\n"
                        "    except RuntimeError as e: blocked.append(str(e).split(' with ')[0])\n"
                        "import pickle, numpy, popdist.data\n"
                        "try: p.Options(2)\n"
                        "except Exception as e: conflict = type(e).__name__\n"
                        "copy = pickle.loads(pickle.dumps(o))\n"
                        "loader = popdist.data.DataLoader(o, numpy.arange(32.0), batch_size=2)\n"
                        "print('frameworks: ' + json.dumps({'instance': o.Distributed.processId, "
                        "'real': isinstance(o, poptorch.Options), 'set': o.calls, 'blocked': blocked, "
                        "'process': [o.Distributed.processId, o.Distributed.numProcesses], "
                        "'pickled': [copy.Distributed.processId, type(copy).__name__], 'conflict': conflict, "
                        "'batches': [list(map(list, item)) for item in loader][0]}))",
                        env=env)
    found = reports(result)
    for index, r in enumerate(found):
        assert r["real"] and r["process"] == [index, 2]
        assert r["set"] == [["replicationFactor", 2]]  # offline: no useIpuId
        assert r["blocked"] == ["Cannot call `useIpuId`", "Cannot call `replicationFactor`",
                                "Cannot call `Distributed.configureProcessId`"]
        assert r["pickled"] == [index, "Options"]  # (PicklingError before: the blocked class had no home)
        assert r["conflict"] == "LaunchConflict"  # (offline, 2 IPUs per replica against 1: accepted before)
        first = 4 * index  # (no randomSeed: a TypeError before; 2 local replicas of 4, 2 rows each)
        assert r["batches"] == [[float(first), float(first + 1)], [float(first + 2), float(first + 3)]]
