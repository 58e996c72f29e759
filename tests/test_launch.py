"""Launching on this host: hello world, the environment contract, output end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from popdist import env
from support import python_program, run_on_terminal, run_poprun

OFFLINE = "--offline-mode=1"


def test_guide_validation_prints_hello_world_twice() -> None:
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", OFFLINE, "echo", "Hello world!")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Hello world!\nHello world!\n"
    assert result.stderr == b""


def test_single_instance_default() -> None:
    result = run_poprun(OFFLINE, "echo", "one")
    assert (result.returncode, result.stdout) == (0, b"one\n")


def launch_env(*args: str, env: dict | None = None) -> list[dict]:
    result = run_poprun(OFFLINE, *args, *python_program("print_env.py"), env=env)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    return sorted(records, key=lambda r: r["api"]["instance"])


def test_environment_contract_per_instance() -> None:
    records = launch_env("--num-instances", "4", "--num-replicas", "8", "--ipus-per-replica", "2")
    assert [r["api"]["instance"] for r in records] == [0, 1, 2, 3]
    for i, record in enumerate(records):
        env, api = record["env"], record["api"]
        assert env["POPDIST_NUM_TOTAL_REPLICAS"] == "8"
        assert env["POPDIST_NUM_IPUS_PER_REPLICA"] == "2"
        assert env["POPDIST_NUM_LOCAL_REPLICAS"] == "2"
        assert env["POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"] == "1"
        assert env["POPDIST_REPLICA_INDEX_OFFSET"] == str(2 * i)
        assert env["POPDIST_LOCAL_INSTANCE_INDEX"] == str(i)
        # REFERENCE: --num-replicas 8 --num-instances 4 --ipus-per-replica 2 gives device ids 24..27
        assert api["device_id"] == 24 + i
        assert env["POPDIST_NODE_DEVICE_ID"] == "30"  # the 16-IPU parent device: 2N - 2
        assert json.loads(env["POPLAR_TARGET_OPTIONS"])["instanceSize"] == "4"
        assert env["OMPI_COMM_WORLD_RANK"] == env["RANK"] == str(i)
        assert env["OMPI_COMM_WORLD_SIZE"] == env["WORLD_SIZE"] == "4"
        assert env["OMPI_COMM_WORLD_LOCAL_RANK"] == env["LOCAL_RANK"] == str(i)
        assert env["OMPI_COMM_WORLD_LOCAL_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
        for name in ("IPUOF_VIPU_API_PARTITION_ID", "IPUOF_VIPU_API_TIMEOUT", "IPUOF_VIPU_API_GCD_ID", "MASTER_ADDR",
                     "MASTER_PORT", "POPRUN_JOB_ID"):
            assert env[name] == records[0]["env"][name], name
        assert api == {"instance": i, "instances": 4, "local_instance": i, "total_replicas": 8, "local_replicas": 2,
                       "offset": 2 * i, "ipus_per_replica": 2, "device_id": 24 + i, "set": True}
    assert "IPUOF_VIPU_API_HOST" not in records[0]["env"] and "IPUOF_VIPU_API_PORT" not in records[0]["env"]  # no server
    assert records[0]["env"]["IPUOF_VIPU_API_TIMEOUT"] == "10"


def test_torchruns_other_names_and_a_chosen_master_port() -> None:
    """torchrun's GROUP_*, ROLE_* and TORCHELASTIC_* names, true of a fixed job that is never restarted; and
    ``-x MASTER_PORT=N`` chooses the port, as torchrun's --master-port (before: refused with a warning)."""
    port = "29511"  # (nothing binds it here)
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2", f"--mpi-local-args=-x MASTER_PORT={port}",
                        *python_program("print_env.py"))
    assert result.returncode == 0 and b"cannot change" not in result.stderr, result.stderr
    records = sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda r: r["api"]["instance"])
    assert len(records) == 2, result.stdout
    for i, record in enumerate(records):
        e = record["env"]
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_NAME"]) == ("0", "1", "default")
        assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"]) == (e["RANK"], e["WORLD_SIZE"]) == (str(i), "2")
        assert e["TORCHELASTIC_RUN_ID"] == e["POPRUN_JOB_ID"] != ""
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
        assert e["MASTER_PORT"] == port


def test_environment_variables_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARD_ME", 'a "quoted" value')
    records = launch_env(
        "--num-instances", "2", "--num-replicas", "2",
        "--mpi-local-args=-x FORWARD_ME -x SET_ME=hello", "--instance-mpi-local-args=1:-x ONLY_ONE=yes",
        "--vipu-server-timeout", "30", "--executable-cache-path", "cache/dir",
        env=dict(os.environ),
    )
    for record in records:
        env = record["env"]
        assert env["FORWARD_ME"] == 'a "quoted" value' and env["SET_ME"] == "hello"
        assert env["IPUOF_VIPU_API_TIMEOUT"] == "30"
        assert env["POPDIST_EXECUTABLE_CACHE_PATH"] == os.path.abspath("cache/dir")
    assert "ONLY_ONE" not in records[0]["env"] and records[1]["env"]["ONLY_ONE"] == "yes"


def test_executable_cache_path_is_created(tmp_path) -> None:
    result = run_poprun(OFFLINE, "--executable-cache-path", "cache/rn50", "true", cwd=tmp_path)
    assert result.returncode == 0 and (tmp_path / "cache" / "rn50").is_dir()


def test_program_in_current_directory_without_dot_slash(tmp_path) -> None:
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho from $POPDIST_REPLICA_INDEX_OFFSET\n")
    script.chmod(0o755)
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "hello.sh", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [b"from 0", b"from 1"]


def test_logs_have_graphcores_format() -> None:
    result = run_poprun(OFFLINE, "-v", "true")
    lines = result.stderr.decode().splitlines()
    assert lines and all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} \d+ POPRUN \[[IDWE]\] .+", line) for line in lines), lines
    assert run_poprun(OFFLINE, "true").stderr == b""
    debug = run_poprun(OFFLINE, "--vv", "true").stderr.decode()
    assert " POPRUN [D] " in debug and "poprun topology" in debug


def test_print_topology() -> None:
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "8", "--print-topology=yes", "true")
    assert result.returncode == 0
    assert "| instances |       0       |       1       |" in result.stderr.decode()


def emit(*args: str, instances: int = 1, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[bytes]:
    n = str(instances)
    return run_poprun(OFFLINE, "--num-instances", n, "--num-replicas", n, *extra, *python_program("emit.py", *args))


def test_tagged_output_goes_to_the_right_stream() -> None:
    result = emit("stderr", instances=2, extra=("--mpi-global-args=--tag-output",))
    assert sorted(result.stdout.splitlines()) == [b"[1,0]<stdout>:to stdout", b"[1,1]<stdout>:to stdout"]
    assert sorted(result.stderr.splitlines()) == [b"[1,0]<stderr>:to stderr", b"[1,1]<stderr>:to stderr"]


def test_output_filename_writes_open_mpi_layout(tmp_path) -> None:
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--mpi-global-args",
                        "--output-filename out", *python_program("emit.py", "stderr"), cwd=tmp_path)
    assert result.returncode == 0
    for i in (0, 1):
        assert (tmp_path / "out" / "1" / f"rank.{i}" / "stdout").read_bytes() == b"to stdout\n"
        assert (tmp_path / "out" / "1" / f"rank.{i}" / "stderr").read_bytes() == b"to stderr\n"


def test_only_output_from_instance() -> None:
    result = emit("lines", "3", instances=3, extra=("--only-output-from-instance", "1"))
    assert result.stdout == b"1 0\n1 1\n1 2\n"


@pytest.mark.parametrize("mode,expected", [
    ("progress", b"\r0%\r50%\r100%\n"),
    ("nonewline", b"first\nlast without newline"),
    ("invalid", b"bad \xff\xfe bytes\n"),
    ("split", "price € 3\n".encode()),
])
def test_awkward_output_arrives_intact(mode: str, expected: bytes) -> None:
    result = emit(mode)
    assert result.returncode == 0 and result.stdout == expected


def test_tagged_progress_bar_keeps_each_redraw_tagged() -> None:
    result = emit("progress", extra=("--mpi-global-args=--tag-output",))
    assert result.stdout == b"[1,0]<stdout>:\r[1,0]<stdout>:0%\r[1,0]<stdout>:50%\r[1,0]<stdout>:100%\n"


def test_ten_megabyte_line_without_newline() -> None:
    size = 10 * 2**20
    result = emit("bigline", str(size), instances=2, extra=("--mpi-global-args=--tag-output",))
    assert result.returncode == 0
    lines = result.stdout.split(b"\n")
    assert sorted(len(line) for line in lines if line) == [len(b"[1,0]<stdout>:") + size] * 2
    assert all(line.rstrip(b"x") in (b"[1,0]<stdout>:", b"[1,1]<stdout>:") for line in lines if line)


def test_a_million_lines_none_lost_torn_or_reordered() -> None:
    per_instance = 250_000
    result = emit("lines", str(per_instance), instances=4, extra=("--mpi-global-args=--tag-output",))
    assert result.returncode == 0, result.stderr
    next_seq = [0, 0, 0, 0]
    for line in result.stdout.split(b"\n")[:-1]:
        match = re.fullmatch(rb"\[1,(\d)\]<stdout>:(\d) (\d+)", line)
        assert match, line[:100]
        tag, index, seq = (int(g) for g in match.groups())
        assert tag == index and seq == next_seq[index]
        next_seq[index] += 1
    assert next_seq == [per_instance] * 4


def test_instances_learn_whether_poprun_writes_to_a_terminal() -> None:
    """Their own stdout is a pipe; this tells them a progress bar would be seen."""
    piped = launch_env("--num-instances", "2", "--num-replicas", "2")
    assert [r["env"][env.CONSOLE_IS_TERMINAL] for r in piped] == ["0", "0"]
    screen = run_on_terminal(OFFLINE, *python_program("print_env.py"))
    (record,) = [json.loads(line[line.index(b'{"env"'):]) for line in screen.splitlines() if b'{"env"' in line]
    assert record["env"][env.CONSOLE_IS_TERMINAL] == "1"


def test_mpirun_wdir_sets_the_instances_directory(tmp_path) -> None:
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
                        f"--mpi-global-args=-wdir {tmp_path}", "pwd")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path).encode()] * 2


def test_a_missing_wdir_is_a_usage_error(tmp_path) -> None:
    result = run_poprun("--offline-mode=1", f"--mpi-global-args=-wdir {tmp_path / 'missing'}", "pwd")
    assert result.returncode == 2 and b"no such directory" in result.stderr


def test_the_program_is_found_with_the_path_x_gives_each_instance(tmp_path) -> None:
    """As Open MPI searches the app's own environment: -x PATH=... first (before, only poprun's PATH: 127), and
    an instance with a PATH of its own (--instance-mpi-local-args) finds its own program."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "s.sh").write_text(f"#!/bin/sh\necho found {name} $RANK\n")
        (tmp_path / name / "s.sh").chmod(0o755)
    system = os.environ["PATH"]
    result = run_poprun(OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                        f"--mpi-local-args=-x PATH={tmp_path}/a:{system}",
                        f"--instance-mpi-local-args=1:-x PATH={tmp_path}/b:{system}", "s.sh", cwd="/")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [b"found a 0", b"found b 1"]
    dry = run_poprun(OFFLINE, "--dry-run=yes", f"--mpi-local-args=-x PATH={tmp_path}/a", "s.sh", cwd="/")
    assert dry.returncode == 0 and f"command: {tmp_path}/a/s.sh".encode() in dry.stdout, dry.stderr


def test_a_program_missing_from_the_path_x_gives_names_that_path(tmp_path) -> None:
    result = run_poprun(OFFLINE, f"--mpi-local-args=-x PATH={tmp_path}", "true", cwd=tmp_path)
    assert result.returncode == 127
    assert result.stderr.decode().splitlines() == [
        "poprun: error: program 'true' not found in instance 0's PATH (set with -x) or the current directory"]


def test_the_executable_cache_path_reaches_instances_absolute(tmp_path) -> None:
    """Relative to where poprun was started, whatever directory the instance is in (before: 'relcache' as typed)."""
    result = run_poprun(OFFLINE, "--executable-cache-path", "relcache", "sh", "-c",
                        'cd / && test -d "$POPDIST_EXECUTABLE_CACHE_PATH" && echo "$POPDIST_EXECUTABLE_CACHE_PATH"',
                        cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"{tmp_path}/relcache\n".encode()), result.stderr
    dry = run_poprun(OFFLINE, "--dry-run=yes", "--executable-cache-path", "newcache", "true", cwd=tmp_path)
    assert dry.returncode == 0 and f"POPDIST_EXECUTABLE_CACHE_PATH={tmp_path}/newcache".encode() in dry.stdout
    assert not (tmp_path / "newcache").exists()  # the dry run creates nothing


def test_merge_stderr_to_stdout_as_open_mpi() -> None:
    """mpirun's --merge-stderr-to-stdout joins stderr to stdout at the source: poprun's stdout, tagged <stdout>
    (before: warned about and ignored)."""
    result = run_poprun(OFFLINE, "--tag-output", "--mpi-global-args=--merge-stderr-to-stdout",
                        "sh", "-c", "echo out; echo err >&2")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [b"[1,0]<stdout>:err", b"[1,0]<stdout>:out"]
    assert result.stderr == b""


def test_output_filename_nocopy_writes_the_files_only(tmp_path) -> None:
    """Open MPI's DIR:nocopy: the files, nothing on the console (before: a directory named 'out:nocopy' and the
    console copy); with the merge, one stdout file holds both streams, as Open MPI's."""
    result = run_poprun(OFFLINE, "--mpi-global-args=--output-filename out:nocopy --merge-stderr-to-stdout",
                        "sh", "-c", "echo out; echo err >&2", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    rank = tmp_path / "out" / "1" / "rank.0"
    assert sorted(os.listdir(rank)) == ["stdout"] and sorted(rank.joinpath("stdout").read_bytes().splitlines()) == [
        b"err", b"out"]
