"""The command line: the guide's launch lines, value syntax, config replay, bad input."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from poprun_py.cli import parse_command_line
from poprun_py.command import resolve_launch
from poprun_py.command_line import CommandLine
from poprun_py.errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_USAGE
from poprun_py.mpiargs import EnvSetting
from support import run_poprun


def spec_of(command: str):
    line = parse_command_line(shlex.split(command)[1:])
    assert isinstance(line, CommandLine)
    spec = resolve_launch(line)
    return spec


GUIDE_LINES = {
    "validation": 'poprun --num-instances 2 --num-replicas 2 --offline-mode=1 echo "Hello world!"',
    "single instance": "poprun --numa-aware=yes --vipu-server-host=10.3.7.150 --vipu-partition=P8 "
    '--vipu-cluster=A8 --mpi-global-args="--tag-output" --num-replicas=4 --num-instances=1 python3 train.py',
    "multi instance single host": "poprun --numa-aware=yes --vipu-server-host=10.3.7.150 --vipu-partition=A8 "
    '--vipu-cluster=A8 --mpi-global-args="--tag-output" --num-replicas=8 --num-instances=2 python3 train.py',
    "multi host": "poprun --host 10.3.7.153,10.3.7.154 --numa-aware=yes --vipu-server-host=10.3.7.150 "
    '--vipu-partition=P8 --vipu-cluster=A8 --num-ilds=1 --mpi-global-args="--tag-output" '
    '--mpi-local-args="-x PYTHONPATH" --num-replicas=8 --num-instances=2 python3 train.py',
    "multi pod": "poprun --host 10.3.7.153,10.3.8.153 --numa-aware=yes --vipu-server-host=10.3.7.150 "
    '--vipu-partition=P8 --vipu-cluster=P8 --num-ilds=2 --mpi-global-args="--tag-output" '
    '--mpi-local-args="-x PYTHONPATH" --num-replicas=8 --num-instances=2 python3 train.py',
    "pytorch example": "poprun --vipu-partition=MyPartition --vipu-server-host=127.0.0.1 --num-replicas=4 "
    "--num-instances=1 --numa-aware=yes -v python main.py",
}


@pytest.mark.parametrize("name", GUIDE_LINES)
def test_guide_command_lines_parse(name: str) -> None:
    spec = spec_of(GUIDE_LINES[name])
    assert spec.program[0] in ("echo", "python3", "python")
    assert spec.placement.num_replicas % spec.placement.num_instances == 0


def test_multi_pod_line_in_detail() -> None:
    spec = spec_of(GUIDE_LINES["multi pod"])
    assert [h.name for h in spec.placement.hosts] == ["10.3.7.153", "10.3.8.153"]
    p = spec.placement
    assert (p.num_replicas, p.num_instances, p.num_ilds) == (8, 2, 2)
    assert spec.vipu.server_host == "10.3.7.150" and spec.vipu.partition == "P8" and spec.vipu.cluster == "P8"
    assert spec.placement.numa_aware is True and spec.output.tag_output
    assert spec.instance.env == (EnvSetting("PYTHONPATH"),)
    assert spec.program == ("python3", "train.py")


def test_defaults_are_the_guides() -> None:
    spec = spec_of("poprun prog")
    p = spec.placement
    assert (p.num_replicas, p.ipus_per_replica, p.num_instances, p.num_ilds) == (1, 1, 1, 1)
    assert spec.vipu.server_port == 8090 and spec.vipu.server_timeout == 10
    assert spec.vipu.update_partition is False and spec.vipu.remove_partition is True
    assert spec.vipu.reset_partition is None
    assert not spec.offline_mode and not spec.output.print_topology and spec.placement.numa_aware is None


@pytest.mark.parametrize("value,expected",
                         [("yes", True), ("no", False), ("true", True), ("False", False), ("1", True), ("0", False)])
def test_booleans_as_users_write_them(value: str, expected: bool) -> None:
    assert spec_of(f"poprun --offline-mode={value} prog").offline_mode is expected
    assert spec_of(f"poprun --offline-mode {value} prog").offline_mode is expected


def test_value_token_starting_with_dashes_and_repeats_merge() -> None:
    spec = spec_of(
        "poprun --mpi-global-args --tag-output --mpi-global-args=--timestamp-output "
        "--mpi-local-args '-x A=1' --mpi-local-args='-x B' --num-replicas 4 prog"
    )
    assert spec.output.tag_output and spec.output.timestamp_output and spec.placement.num_replicas == 4
    assert spec.instance.env == (EnvSetting("A", "1"), EnvSetting("B"))


def test_first_non_option_is_the_program_and_the_rest_is_its() -> None:
    spec = spec_of("poprun --num-replicas 2 --num-instances 2 python3 train.py --num-replicas 9 -v")
    assert spec.program == ("python3", "train.py", "--num-replicas", "9", "-v")
    assert spec.placement.num_replicas == 2 and spec.output.verbosity == 0


def test_verbosity_spellings() -> None:
    assert spec_of("poprun -v prog").output.verbosity == 1
    assert spec_of("poprun -vv prog").output.verbosity == 2
    assert spec_of("poprun --vv prog").output.verbosity == 2


def test_mpi_pass_through_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_of(
        "poprun --mpi-global-args='--tag-output --allow-run-as-root --output-filename out --bind-to none "
        "--mca btl tcp,self' --mpi-local-args='-x PATH -x V=\"a b\"' --instance-mpi-local-args='1:-x ONLY=1' "
        "--num-replicas 2 --num-instances 2 prog"
    )
    assert spec.output.output_filename == "out" and spec.output.tag_output
    assert spec.instance.env == (EnvSetting("PATH"), EnvSetting("V", "a b"))
    assert spec.instance.instance_env[1] == (EnvSetting("ONLY", "1"),)
    warnings = [line for line in capsys.readouterr().err.splitlines() if " POPRUN [W] " in line]
    assert any("--mca btl tcp,self" in w for w in warnings), warnings
    assert not any("bind-to" in w or "allow-run-as-root" in w for w in warnings)


def test_mpirun_bind_to_reaches_the_placement(capsys: pytest.CaptureFixture[str]) -> None:
    """mpirun's --bind-to levels poprun-py has become the placement's; a later argument wins; a level it has
    not is warned about by name; in --instance-mpi-local-args it applies to no one, and says so."""
    assert spec_of("poprun --mpi-global-args='--bind-to numa' --mpi-local-args='--bind-to core' prog").placement \
        .bind_to == "core"
    spec = spec_of("poprun --mpi-local-args='--bind-to hwthread:overload-allowed' prog")
    assert spec.placement.bind_unit == "hwthread" and spec.placement.bind_overload and spec.placement.numa_wanted
    assert spec_of("poprun --mpi-local-args='--bind-to none' --num-instances 2 --num-replicas 2 prog").placement \
        .numa_wanted is False
    capsys.readouterr()
    spec = spec_of("poprun --mpi-local-args='--bind-to socket' --instance-mpi-local-args='1:--bind-to core' "
                   "--num-instances 2 --num-replicas 2 prog")
    assert spec.placement.bind_to is None
    warnings = [line for line in capsys.readouterr().err.splitlines() if " POPRUN [W] " in line]
    assert any("'--bind-to socket'" in w for w in warnings) and any("=1: ignoring --bind-to" in w for w in warnings), \
        warnings


def test_config_export_then_import_with_override(tmp_path) -> None:
    config = tmp_path / "launch.json"
    line = parse_command_line(
        ["--export-config", str(config), "--num-replicas", "4", "--num-instances", "2",
         "--mpi-global-args=--tag-output", "--offline-mode=yes", "prog", "arg"]
    )
    resolve_launch(line)
    saved = json.loads(config.read_text())
    assert saved["program"] == ["prog", "arg"] and saved["options"]["num_replicas"] == 4
    replay = parse_command_line(["--import-config", str(config), "--num-replicas", "8", "--mpi-global-args=--timestamp-output"])
    again = resolve_launch(replay)
    assert again.placement.num_replicas == 8 and again.placement.num_instances == 2 and again.offline_mode
    assert again.output.tag_output and again.output.timestamp_output
    assert again.program == ("prog", "arg")


def test_export_refuses_to_overwrite_unless_asked(tmp_path) -> None:
    config = tmp_path / "launch.json"
    config.write_text("{}")
    result = run_poprun("--export-config", str(config), "true")
    assert result.returncode == EXIT_USAGE and b"--overwrite-config" in result.stderr
    result = run_poprun("--export-config", str(config), "--overwrite-config=yes", "--num-replicas", "3")
    assert result.returncode == 0 and json.loads(config.read_text())["options"]["num_replicas"] == 3


BAD_INPUT = [
    (["--num-replicas", "3", "--num-instances", "2", "true"], b"divided evenly"),
    (["--num-replicas", "0", "true"], b"at least 1"),
    (["--num-instances", "-1", "true"], b"at least 1"),
    (["--num-replicas", "x", "true"], b"not a valid"),
    (["--frobnicate", "true"], b"No such option"),
    (["--offline-mode=maybe", "true"], b"not a boolean"),
    (["--numa-aware=perhaps", "true"], b"not a boolean"),
    (["--num-instances", "2", "--num-replicas", "2"], b"no program"),
    (["--only-output-from-instance", "5", "--num-instances", "2", "--num-replicas", "2", "true"], b"only-output-from-instance"),
    (["--process-placement", "everywhere", "true"], b"spreadnuma"),
    (["--instance-mpi-local-args=9:-x A=1", "true"], b"instance 9 does not exist"),
    (["--mpi-global-args", "'unclosed", "true"], b"quotes"),
    (["--mpi-local-args", "-x 1BAD=2", "true"], b"valid variable name"),
    (["-H", "node[3-1]", "true"], b"node[3-1]"),
    (["-H", "a,b", "--num-instances", "3", "--num-replicas", "3", "true"], b"2 hosts"),
    (["--import-config", "/nonexistent/launch.json", "true"], b"no such file"),
    (["--vipu-server-port", "70000", "true"], b"TCP port"),
    (["--num-replicas"], b"requires an argument"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: bytes) -> None:
    result = run_poprun(*args)
    assert result.returncode == EXIT_USAGE, result.stderr
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("poprun: error:") and needle in result.stderr
    assert b"Traceback" not in result.stderr and result.stdout == b""


def test_missing_program_is_127(tmp_path) -> None:
    result = run_poprun("--offline-mode=1", "no-such-program-xyz", cwd=tmp_path)
    assert result.returncode == EXIT_NOT_FOUND
    assert result.stderr.decode().splitlines() == [
        "poprun: error: program 'no-such-program-xyz' not found in PATH or the current directory"
    ]


@pytest.mark.parametrize("order, code", [(("plain",), EXIT_NOT_EXECUTABLE), (("plain", "runnable"), 0),
                                         (("runnable", "plain"), 0)])
def test_a_program_in_path_that_is_not_executable_is_126_unless_one_is(tmp_path, order, code: int) -> None:
    """As bash: the first executable one in PATH runs; only files without execute permission there is 126,
    "Permission denied" (before: 127, "not found in PATH")."""
    for name, mode in (("plain", 0o644), ("runnable", 0o755)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a-tool").write_text("#!/bin/sh\necho ran\n")
        (tmp_path / name / "a-tool").chmod(mode)
    (tmp_path / "work").mkdir()
    path = os.pathsep.join([*(str(tmp_path / name) for name in order), os.environ["PATH"]])
    result = run_poprun("--offline-mode=1", "a-tool", cwd=tmp_path / "work", env={**os.environ, "PATH": path})
    assert result.returncode == code, result.stderr
    if code:
        assert result.stderr.decode().splitlines() == [
            f"poprun: error: program 'a-tool' in PATH is {tmp_path / 'plain' / 'a-tool'}, which is not executable "
            "(chmod +x, or run it with its interpreter)"]
    else:
        assert result.stdout == b"ran\n"


def test_program_not_executable_is_126(tmp_path) -> None:
    (tmp_path / "script.sh").write_text("echo hi\n")
    result = run_poprun("--offline-mode=1", "./script.sh", cwd=tmp_path)
    assert result.returncode == EXIT_NOT_EXECUTABLE and b"chmod +x" in result.stderr


@pytest.mark.parametrize("content, needle", [
    (b"echo no interpreter line\n", "./prog: cannot execute: not a program for this machine, or a script without a "
                                      "'#!' line (add one, or run it with its interpreter)"),
    (b"\x7fELFnot really\n", "./prog: cannot execute: not a program for this machine"),
], ids=["script without #!", "corrupt binary"])
def test_a_program_the_kernel_cannot_execute_is_126_with_one_line(tmp_path, content, needle) -> None:
    """ENOEXEC, as bash gives it: 126 and why, not exit 70 and "internal error" (an OSError unhandled)."""
    (tmp_path / "prog").write_bytes(content)
    (tmp_path / "prog").chmod(0o755)
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "./prog", cwd=tmp_path)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == EXIT_NOT_EXECUTABLE, lines
    assert len(lines) == 1 and lines[0].startswith("poprun: error: ") and needle in lines[0], lines


def test_a_script_whose_interpreter_is_missing_says_so(tmp_path) -> None:
    """The kernel says ENOENT for a script whose '#!' interpreter is missing: 127 as bash, naming the
    interpreter (before: "no such program", of a file that is there)."""
    (tmp_path / "prog").write_text("#!/nonexistent/python3 -u\nprint('hi')\n")
    (tmp_path / "prog").chmod(0o755)
    result = run_poprun("--offline-mode=1", "./prog", cwd=tmp_path)
    assert result.returncode == EXIT_NOT_FOUND
    assert result.stderr.decode().splitlines() == [
        "poprun: error: ./prog: cannot execute: its interpreter /nonexistent/python3 (its '#!' line) was not found"]


@pytest.mark.parametrize("content, code, said", [
    (b"#!/bin/sh\r\necho hi\r\n", EXIT_NOT_FOUND, "./prog: cannot execute: its '#!' line names the interpreter "
     "/bin/sh\\r, with a carriage return: the file has Windows line endings (convert it, e.g. with dos2unix)"),
    (b"#!/\necho hi\n", EXIT_NOT_EXECUTABLE, "./prog: cannot execute: its interpreter / (its '#!' line) is a directory"),
    (b"#!./data\necho hi\n", EXIT_NOT_EXECUTABLE,
     "./prog: cannot execute: its interpreter ./data (its '#!' line) is not executable"),
], ids=["Windows line endings", "interpreter a directory", "interpreter not executable"])
def test_a_script_whose_interpreter_cannot_run_says_why(tmp_path, content: bytes, code: int, said: str) -> None:
    """Before: "its interpreter /bin/sh ... was not found" of a /bin/sh that is there (the \\r was taken for a
    space), and "permission denied (is it executable?)" of a script that is."""
    (tmp_path / "prog").write_bytes(content)
    (tmp_path / "prog").chmod(0o755)
    (tmp_path / "data").write_text("not a program\n")
    result = run_poprun("--offline-mode=1", "./prog", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert result.stderr.decode().splitlines() == [f"poprun: error: {said}"]


def test_a_pipe_as_the_program_is_126_and_said(tmp_path) -> None:
    import os

    os.mkfifo(tmp_path / "pipe", 0o755)
    result = run_poprun("--offline-mode=1", "./pipe", cwd=tmp_path)
    assert result.returncode == EXIT_NOT_EXECUTABLE, result.stderr
    assert result.stderr.decode().splitlines() == ["poprun: error: ./pipe: cannot execute: not a regular file"]


def test_help_and_version_exit_0() -> None:
    assert run_poprun("--help").returncode == 0
    version = run_poprun("--version")
    assert version.returncode == 0 and version.stdout.startswith(b"poprun (poprun-py)")


def test_a_host_file_may_be_a_pipe() -> None:
    """The bound on what is read (4 MiB) needs no regular file: ``--host-file <(make_hosts)`` is a pipe."""
    import subprocess

    from support import RUN_TIMEOUT, poprun_command

    result = subprocess.run(poprun_command("--offline-mode=1", "--dry-run=yes", "--host-file", "/dev/stdin", "true"),
                            input=b"# made by a command\nlocalhost\n", capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert b"hosts: localhost (this host)" in result.stdout


def test_a_host_file_with_a_byte_order_mark_is_read_as_a_config_is(tmp_path) -> None:
    """Saved by Notepad; before: "bad host name '\\ufefflocalhost'" and exit 2."""
    (tmp_path / "hosts").write_bytes(b"\xef\xbb\xbflocalhost\n")
    result = run_poprun("--offline-mode=1", "--dry-run=yes", "--host-file", "hosts", "true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert b"hosts: localhost (this host)" in result.stdout


def test_vipu_cluster_and_allocation_naming_the_same_one_agree(tmp_path) -> None:
    """Two names for where partitions are created: the same one twice is no contradiction (different: exit 2)."""
    result = run_poprun("--dry-run=yes", "--vipu-cluster", "c1", "--vipu-allocation", "c1", "true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert b" in cluster c1" in result.stdout


@pytest.mark.parametrize("typed", ["./adir", "adir"])
def test_a_directory_as_the_program_is_126_and_said(tmp_path, typed: str) -> None:
    """As bash: "is a directory", 126; not advice to chmod it, nor "not found" for one in the current directory."""
    (tmp_path / "adir").mkdir()
    result = run_poprun("--offline-mode=1", typed, cwd=tmp_path)
    assert result.returncode == EXIT_NOT_EXECUTABLE, result.stderr
    assert result.stderr.decode().splitlines() == [
        f"poprun: error: program {typed!r}{'' if '/' in typed else ' in the current directory'} is a directory"]


@pytest.mark.parametrize("typed, code, said", [
    ("/" + "x" * 300, EXIT_NOT_EXECUTABLE, ": cannot execute: File name too long"),
    ("./" + "x" * 300 + "/prog", EXIT_NOT_EXECUTABLE, ": cannot execute: File name too long"),
    ("x" * 300, EXIT_NOT_FOUND, " not found in PATH or the current directory"),
], ids=["absolute", "a directory's name", "bare name"])
def test_a_program_name_too_long_is_said_as_bash_says_it(tmp_path, typed: str, code: int, said: str) -> None:
    """ENAMETOOLONG while looking the program up: 126 and why (named with a '/'), 127 (looked for in PATH), as
    bash; not exit 70 and "internal error: OSError" (before)."""
    result = run_poprun("--offline-mode=1", typed, cwd=tmp_path)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == code, lines
    assert len(lines) == 1 and lines[0] == f"poprun: error: program {typed!r}{said}", lines


def test_a_saved_argument_of_undecodable_bytes_replays(tmp_path) -> None:
    """Bytes that are not UTF-8 are saved as Python's surrogate escapes (\\udcff) and replay as the same bytes:
    not refused as the lone surrogates no argument can hold (\\ud800, only a hand-written file has those)."""
    import os

    saved = tmp_path / "saved.json"
    first = run_poprun("--offline-mode=1", "--export-config", str(saved), "echo", os.fsdecode(b"a\xffb"))
    replay = run_poprun("--import-config", str(saved))
    assert first.returncode == replay.returncode == 0, replay.stderr
    assert first.stdout == replay.stdout == b"a\xffb\n"


@pytest.mark.parametrize("name, value", [
    ("COLUMNS", "99999999999"), ("COLUMNS", "1000000"), ("COLUMNS", "0"), ("TERMINAL_WIDTH", "abc"),
    ("TERMINAL_WIDTH", "0"),
])
def test_help_is_drawn_whatever_width_the_environment_says(name: str, value: str) -> None:
    """rich and typer read these unchecked: before, exit 70 (MemoryError, ValueError), 117 MB of spaces, or
    exit 0 with no help at all. Instances still get the variable as poprun was given it."""
    import os

    environ = {**os.environ, name: value}
    shown = run_poprun("--help", env=environ)
    assert shown.returncode == 0 and shown.stderr == b"", shown.stderr
    assert b"Usage: poprun" in shown.stdout and len(shown.stdout) < 100_000
    launched = run_poprun("--offline-mode=1", "sh", "-c", f"echo ${name}", env=environ)
    assert launched.returncode == 0 and launched.stdout == f"{value}\n".encode(), launched.stderr


@pytest.mark.parametrize("args, said", [
    ((), "the instances would start in it"),
    (("--dry-run=yes",), "the instances would start in it"),
    (("--executable-cache-path", "cache"), "--executable-cache-path 'cache' is relative to it"),
], ids=["launch", "dry run", "a relative path"])
def test_a_current_directory_deleted_is_said(tmp_path, args: tuple[str, ...], said: str) -> None:
    """A shell left in a directory removed since: before, 'internal error: FileNotFoundError', exit 70."""
    import subprocess

    from support import RUN_TIMEOUT, poprun_command

    gone = tmp_path / "gone"
    gone.mkdir()
    command = shlex.join(poprun_command("--offline-mode=1", *args, "/bin/true"))
    result = subprocess.run(["sh", "-c", f'cd "$1" && rmdir "$1" && exec {command}', "sh", str(gone)],
                            capture_output=True, timeout=RUN_TIMEOUT)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == EXIT_USAGE, lines
    assert len(lines) == 1 and lines[0].startswith("poprun: error: the current directory no longer exists (deleted?)")
    assert said in lines[0]


def test_a_deleted_current_directory_does_not_matter_with_wdir(tmp_path) -> None:
    import subprocess

    from support import RUN_TIMEOUT, poprun_command

    gone = tmp_path / "gone"
    gone.mkdir()
    command = shlex.join(poprun_command("--offline-mode=1", f"--mpi-global-args=-wdir {tmp_path}", "pwd"))
    result = subprocess.run(["sh", "-c", f'cd "$1" && rmdir "$1" && exec {command}', "sh", str(gone)],
                            capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0 and result.stdout == f"{tmp_path}\n".encode(), result.stderr
