"""The examples, each run through the real poprun CLI (non-offline: a partition from the embedded V-IPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import EXAMPLES, RUN_TIMEOUT, program, python_example, run_on_terminal, run_poprun

MAIN_JOB = ("--num-instances", "2", "--num-replicas", "4")
OFFLINE_ONE = ("--offline-mode=1", "--num-instances", "1", "--num-replicas", "1")
#: Weights and loss curves of the same global batch on different topologies agree within this (float64).
#: Only the order of the gradient sum differs: one GEMM over the 64 samples of a step, or per-replica GEMMs
#: summed replica by replica and instance by instance. Each order is within (B-1)u sum|g_i| of the exact sum
#: (u = 2**-53, B = 64), so two steps' gradients differ by ~1.4e-14 of sum|g_i|; over S = 220 steps of lr 0.5
#: that bounds the drift near S * lr * 1.4e-14 * max|g| ~ 1e-12 (per-sample gradients here are O(1)), before
#: any growth through the training dynamics. Measured: about 1e-15. 1e-9 leaves three orders of magnitude for
#: that growth, while a real difference (one pair of samples exchanged between the first two steps) moves the
#: weights by up to 2e-2.
NUMERICS_TOLERANCE = 1e-9


def text(output: bytes) -> str:
    return output.decode()


def test_hello_from_every_instance() -> None:
    result = run_poprun(*MAIN_JOB, *python_example("hello.py"))
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout).splitlines()) == [
        "Hello world from instance 0 of 2, holding replicas 0-1 of 4",
        "Hello world from instance 1 of 2, holding replicas 2-3 of 4",
    ]


def test_popdist_info_prints_every_value_of_each_instance() -> None:
    result = run_poprun(*MAIN_JOB, *python_example("popdist_info.py"))
    assert result.returncode == 0, result.stderr
    lines = text(result.stdout).splitlines()
    for me, device in ((0, 4), (1, 5)):
        mine = {m[1]: m[2] for m in (re.match(rf"instance {me}  (.+?)\s{{2,}}(\S.*)$", line) for line in lines) if m}
        assert mine["getInstanceIndex()"] == str(me) and mine["getNumInstances()"] == "2"
        assert mine["getNumTotalReplicas()"] == "4" and mine["getNumLocalReplicas()"] == "2"
        assert mine["getReplicaIndexOffset()"] == str(2 * me) and mine["getDeviceId()"] == str(device)
        assert mine["isPopdistEnvSet()"] == "True" and mine["parent device id"] == "6"
        assert mine["V-IPU partition"].startswith("poprun-") and mine["offline mode"] == "False"
        assert mine["V-IPU server"] == "embedded (no V-IPU server)"  # before: localhost:8090, where none was
    assert "not launched by poprun" not in text(result.stdout)


def test_popdist_info_outside_poprun_says_so() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_"))}
    result = subprocess.run(python_example("popdist_info.py"), capture_output=True, timeout=RUN_TIMEOUT, env=env)
    assert result.returncode == 0, result.stderr
    lines = text(result.stdout).splitlines()
    assert lines[0].startswith("not launched by poprun")
    assert "instance 0  getNumTotalReplicas()            1" in lines


def checkpoint_for(tmp_path: Path, layout: tuple[str, ...]) -> Path:
    return tmp_path / f"checkpoint{''.join(layout).replace('--', '-')}.npz"


def train(tmp_path: Path, *layout: str, extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict]:
    checkpoint = checkpoint_for(tmp_path, layout)
    result = run_poprun(*layout, "--mpi-global-args=--tag-output",
                        *python_example("train.py", "--checkpoint", str(checkpoint), *extra))
    assert result.returncode == 0, result.stderr
    with np.load(checkpoint) as saved:
        return result, {name: saved[name] for name in saved.files}


def test_main_job_trains_data_parallel_and_reports_from_instance_0(tmp_path: Path) -> None:
    result, saved = train(tmp_path, *MAIN_JOB)
    lines = text(result.stdout).splitlines()
    epochs = [line for line in lines if "]<stdout>:epoch " in line]
    assert len(epochs) == 10 and all(line.startswith("[1,0]") for line in epochs)  # only instance 0 reports
    assert re.search(r"loss \d\.\d{4}  train acc .*test acc .*samples/s", epochs[0])
    digests = {re.search(r"weights sha256 (\w+)", line)[1] for line in lines if "training samples per epoch" in line}
    assert len(digests) == 1  # both instances hold the same weights
    assert [line for line in lines if "checkpoint saved" in line] == [
        f"[1,0]<stdout>:checkpoint saved by instance 0: {checkpoint_for(tmp_path, MAIN_JOB)}"]
    (summary,) = [line for line in lines if "weights bit-identical" in line]
    assert summary.startswith("[1,0]<stdout>:weights bit-identical on every replica (4)")
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", summary)[1])
    assert accuracy >= 95 and re.search(r"[\d,]+ samples/s; collectives \d+% of each step", summary)
    assert saved["history"].shape == (10, 3) and int(saved["replicas"]) == 4
    assert "\r" not in text(result.stdout)  # no progress bar: poprun's console is not a terminal here


@pytest.mark.parametrize("layout", [MAIN_JOB, ("--num-instances", "2", "--num-replicas", "8"),
                                    ("--num-instances", "4", "--num-replicas", "16")])
def test_same_global_batch_trains_the_same_on_1_replica_and_on_many(tmp_path: Path, layout: tuple[str, ...]) -> None:
    _, single = train(tmp_path, "--num-instances", "1", "--num-replicas", "1")
    _, many = train(tmp_path, *layout)
    np.testing.assert_allclose(many["history"], single["history"], rtol=0, atol=NUMERICS_TOLERANCE)
    np.testing.assert_allclose(many["weights"], single["weights"], rtol=0, atol=NUMERICS_TOLERANCE)


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    """The second save's writes fail past half the checkpoint's size (``file_size_limit.py``), as a Ctrl-C, a
    SIGTERM or a full disk would stop them. Before, ``np.savez`` wrote the checkpoint's own path: the good
    checkpoint was truncated and left half-written."""
    checkpoint = tmp_path / "model.npz"
    first = run_poprun(*OFFLINE_ONE, *python_example("train.py", "--epochs", "1", "--checkpoint", str(checkpoint)))
    assert first.returncode == 0, first.stderr
    assert b", lr 0.5, 1 epoch\n" in first.stdout, first.stdout  # before: "1 epochs"
    good = checkpoint.read_bytes()
    interrupted = run_poprun(*OFFLINE_ONE, sys.executable, program("file_size_limit.py"), str(len(good) // 2),
                             str(EXAMPLES / "train.py"), "--epochs", "2", "--checkpoint", str(checkpoint))
    assert interrupted.returncode == 1 and b"File too large" in interrupted.stderr, interrupted.stderr
    assert checkpoint.read_bytes() == good
    assert os.listdir(tmp_path) == ["model.npz"]  # no temporary file left behind either


@pytest.mark.parametrize("argv, error", [
    (("--batch-size", "4000"), "--batch-size 4000 is larger than the 1437 training samples"),
    (("--batch-size", "0"), "--batch-size must be at least 1"),
])
def test_the_examples_bad_arguments_are_one_line_errors(argv: tuple[str, ...], error: str) -> None:
    result = subprocess.run(python_example("train.py", "--checkpoint", "", *argv), capture_output=True,
                            timeout=RUN_TIMEOUT)
    assert result.returncode == 2 and error in result.stderr.decode(), result.stderr
    assert b"Traceback" not in result.stderr


def test_progress_bar_when_asked(tmp_path: Path) -> None:
    result, _ = train(tmp_path, *MAIN_JOB, extra=("--epochs", "2", "--progress", "on"))
    out = text(result.stdout)
    # tagged: each redraw is a tagged segment of its own, ended by \r
    assert "<stdout>:epoch 1/2 [#" in out and "] 22/22\r" in out and "\x1b[Kepoch  2/2  loss" in out


def test_progress_bar_on_a_terminal_without_asking() -> None:
    """poprun tells instances when its own stdout is a terminal (their stdout is a pipe)."""
    screen = run_on_terminal(*MAIN_JOB, *python_example("train.py", "--epochs", "1", "--checkpoint", ""))
    assert b"epoch 1/1 [#" in screen and b"] 22/22\r" in screen


def test_torch_distributed_initialises_with_no_arguments_under_poprun() -> None:
    pytest.importorskip("torch", reason="torch's CPU build (README, Dependencies; scripts/test.sh installs it)")
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", *python_example("torch_ddp.py"))
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout).splitlines()) == [
        "rank 0 of 2: all_reduce(sum of ranks) = 1, DDP averaged gradient = 3",
        "rank 1 of 2: all_reduce(sum of ranks) = 1, DDP averaged gradient = 3",
    ]
