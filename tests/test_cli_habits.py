"""mpirun and torchrun habits: bare yes/no flags, -np, --tag-output, --timeout, --dry-run,
OMP_NUM_THREADS, and a --help that says what each value is. Real poprun processes where it matters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.cli import parse_command_line
from poprun_py.command import resolve_launch
from poprun_py.command_line import CommandLine
from poprun_py.errors import _MEANINGS, EXIT_TIMEOUT, EXIT_USAGE, exit_code_meanings, exit_codes
from poprun_py.plan import OMP_NUM_THREADS, Programs, make_plan, offline_allocation
from poprun_py.spec import build_spec
from support import RUN_TIMEOUT, program, run_poprun

#: Every yes/no option of poprun (the guide's and ours).
BOOLEAN_OPTIONS = ("--offline-mode", "--allow-run-as-root", "--print-topology", "--numa-aware", "--update-partition",
                   "--reset-partition", "--remove-partition", "--overwrite-config", "--tag-output", "--dry-run")
OFFLINE = ("--offline-mode", "--num-instances", "2", "--num-replicas", "2")


def given(argv: list[str]) -> CommandLine:
    line = parse_command_line(argv)
    assert isinstance(line, CommandLine), line
    return line


def value_of(line: CommandLine, flag: str) -> str | None:
    name = flag[2:].replace("-", "_")
    return line.dry_run if name == "dry_run" else line.overwrite_config if name == "overwrite_config" \
        else line.given.get(name)


# -- bare flags: the rule of argv.py, as a matrix -----------------------------------------------------
# (what follows the flag on the command line) -> (the option's value, the program)
MATRIX = [
    (["python3", "x.py"], "yes", ("python3", "x.py")),  # a bare flag, then the program: the program runs
    (["--num-replicas", "2", "prog"], "yes", ("prog",)),  # a bare flag, then another option
    (["-v", "prog"], "yes", ("prog",)),
    (["--", "yes"], "yes", ("yes",)),  # a program named yes, after --
    (["yes", "prog"], "yes", ("prog",)),  # --opt WORD: the guide's form
    (["no", "prog"], "no", ("prog",)),
    (["1", "prog"], "1", ("prog",)),
    (["0", "prog"], "0", ("prog",)),
    (["OFF", "prog"], "OFF", ("prog",)),
    (["true", "1"], "true", ("1",)),  # the first boolean word is the value, the next one the program
]


@pytest.mark.parametrize("flag", BOOLEAN_OPTIONS)
@pytest.mark.parametrize("after,value,program_", MATRIX, ids=[" ".join(m[0]) for m in MATRIX])
def test_a_boolean_option_bare_or_with_a_value(flag: str, after: list[str], value: str,
                                              program_: tuple[str, ...]) -> None:
    line = given([flag, *after])
    assert value_of(line, flag) == value and line.program == program_


@pytest.mark.parametrize("flag", BOOLEAN_OPTIONS)
@pytest.mark.parametrize("written,value", [("=yes", "yes"), ("=no", "no"), ("=1", "1"), ("=0", "0")])
def test_the_guides_equals_form_is_unchanged(flag: str, written: str, value: str) -> None:
    line = given([flag + written, "prog", "--offline-mode"])  # the program's own arguments are its own
    assert value_of(line, flag) == value and line.program == ("prog", "--offline-mode")


def test_a_bare_flag_at_the_end_means_yes() -> None:
    assert given(["--export-config", "saved.json", "--offline-mode"]).given["offline_mode"] == "yes"


def test_a_value_that_looks_like_a_boolean_stays_with_its_own_option() -> None:
    line = given(["--vipu-partition", "yes", "--offline-mode", "-H", "no", "prog"])
    assert line.given["vipu_partition"] == "yes" and line.given["offline_mode"] == "yes"
    assert list(line.given["host"]) == ["no"] and line.program == ("prog",)


def test_a_host_after_flags_in_one_cluster_is_the_hosts_not_the_program() -> None:
    """``-vH node1 --offline-mode prog``: before, ``node1`` ended poprun's options, so ``--offline-mode`` was
    left bare for the parser, which took ``prog`` for its value ('--offline-mode: 'prog' is not a boolean')."""
    line = given(["-vH", "node1", "--offline-mode", "prog"])
    assert list(line.given["host"]) == ["node1"] and line.given["verbose"] == 1
    assert line.given["offline_mode"] == "yes" and line.program == ("prog",)


def test_bare_flags_become_the_launch_they_say() -> None:
    line = given(["--offline-mode", "--print-topology", "--tag-output", "--numa-aware", "--update-partition",
                  "--remove-partition", "no", "--allow-run-as-root", "python3", "x.py"])
    spec = resolve_launch(line)
    assert spec.offline_mode and spec.output.print_topology and spec.output.tag_output and spec.placement.numa_aware
    assert spec.vipu.update_partition and not spec.vipu.remove_partition
    assert spec.program == ("python3", "x.py")


def test_a_bare_flag_before_the_program_runs_it() -> None:
    result = run_poprun("--offline-mode", "--allow-run-as-root", sys.executable, "-c", "print('ran')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"ran\n"


def test_a_word_that_is_not_a_boolean_after_equals_is_a_usage_error() -> None:
    result = run_poprun("--offline-mode=perhaps", "true")
    assert result.returncode == EXIT_USAGE and b"not a boolean" in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("argv,hint", [
    (["-np", "4", "python3", "x.py"], b"-np is mpirun's option; use --num-instances 4"),
    (["-np=8", "x"], b"use --num-instances 8"),
    (["--offline-mode", "-n", "2", "x"], b"-n is mpirun's option; use --num-instances 2"),
    (["--nproc-per-node", "2", "x"], b"use --num-instances 2 (times the number of hosts)"),
    (["--nproc_per_node=4", "x"], b"use --num-instances 4"),
])
def test_mpirun_and_torchrun_counts_get_a_hint(argv: list[str], hint: bytes) -> None:
    result = run_poprun(*argv)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.count(b"\n") == 1 and hint in result.stderr, result.stderr


@pytest.mark.parametrize("argv,hint", [
    (["-x", "FOO=1", "echo", "hi"], b"-x is mpirun's option; poprun takes mpirun's options as Graphcore's PopRun "
                                    b"does: --mpi-local-args='-x FOO=1'"),
    (["-x=PATH", "echo"], b"--mpi-local-args='-x PATH'"),
    (["--bind-to", "core", "x"], b"--mpi-global-args='--bind-to core'"),
    (["--oversubscribe", "x"], b"--mpi-global-args='--oversubscribe'"),
    (["--timestamp-output", "x"], b"--mpi-global-args='--timestamp-output'"),
])
def test_mpiruns_own_options_get_a_hint_to_their_place(argv: list[str], hint: bytes) -> None:
    """Before: "No such option: -x" (and for --oversubscribe a suggestion of --verbose)."""
    result = run_poprun(*argv)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.count(b"\n") == 1 and hint in result.stderr, result.stderr


def test_np_inside_the_programs_arguments_is_the_programs() -> None:
    line = given(["--offline-mode", "prog", "-np", "4"])
    assert line.program == ("prog", "-np", "4")


# -- --tag-output ---------------------------------------------------------------------------------------
SAY = ("-c", "import sys, popdist; print('out'); print('err', file=sys.stderr)")


def test_tag_output_is_an_option_of_its_own() -> None:
    result = run_poprun(*OFFLINE, "--tag-output", sys.executable, *SAY)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [b"[1,0]<stdout>:out", b"[1,1]<stdout>:out"]
    assert sorted(result.stderr.splitlines()) == [b"[1,0]<stderr>:err", b"[1,1]<stderr>:err"]


def test_tag_output_no_leaves_lines_alone_and_is_saved_with_the_launch(tmp_path: Path) -> None:
    result = run_poprun(*OFFLINE, "--tag-output=no", sys.executable, *SAY)
    assert result.returncode == 0 and result.stdout == b"out\nout\n"
    saved = tmp_path / "launch.json"
    assert run_poprun("--tag-output", "--export-config", str(saved)).returncode == 0
    spec = resolve_launch(given(["--import-config", str(saved), "prog"]))
    assert spec.output.tag_output


# -- --timeout ------------------------------------------------------------------------------------------
def test_timeout_stops_the_job_with_its_own_exit_code() -> None:
    result = run_poprun(*OFFLINE, "--timeout", "2", sys.executable, program("behave.py"), "--others", "sleep")
    assert result.returncode == EXIT_TIMEOUT == 124, result.stderr
    assert b"timed out after 2s: poprun stopped the instances" in result.stderr


def test_a_tiny_timeout_is_said_as_given() -> None:
    """Before, --timeout 1e-320 said "timed out after 9.99989e-321s" (``:g`` of a float that small)."""
    result = run_poprun(*OFFLINE, "--timeout", "1e-320", "sleep", "30")
    assert result.returncode == EXIT_TIMEOUT, result.stderr
    assert b"timed out after 1e-320s: poprun stopped the instances" in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_bad_timeout_is_a_usage_error(value: str) -> None:
    result = run_poprun("--offline-mode", "--timeout", value, "true")
    assert result.returncode == EXIT_USAGE and b"--timeout" in result.stderr
    assert len(result.stderr.splitlines()) == 1


# -- --dry-run ------------------------------------------------------------------------------------------
def test_dry_run_prints_each_instance_and_starts_nothing(tmp_path: Path) -> None:
    state = Path(os.environ["XDG_STATE_HOME"])
    marker = tmp_path / "ran"
    result = run_poprun("--dry-run", "--num-instances", "2", "--num-replicas", "4",
                        "--mpi-local-args", "-x PLAIN=visible -x MY_SECRET=hunter2 -x API_TOKEN=t0k3n",
                        sys.executable, "-c", f"open({str(marker)!r}, 'w')", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert not marker.exists()  # the program never ran
    assert not (state / "poprun-py").exists()  # no V-IPU state touched, so no partition created
    for index in (0, 1):
        block = out.split(f"instance {index} on localhost:\n")[1].split("instance ")[0]
        assert f"  command: {sys.executable} -c " in block
        assert f"  cwd: {tmp_path}\n" in block
        assert "    PLAIN=visible\n" in block and f"    RANK={index}\n" in block
        assert "    MY_SECRET=********\n" in block and "    API_TOKEN=********\n" in block
        assert "    POPRUN_JOB_TOKEN=********\n" in block
    assert "hunter2" not in out and "t0k3n" not in out
    assert "partition: " in out and "4 IPUs, 2 GCDs" in out


#: Each instance's RANK and the names of the environment it was started with (/proc: before Python sets any).
PRINT_ENV_NAMES = (sys.executable, "-c", "import json, os; start = open('/proc/self/environ', 'rb').read(); "
                   "print(os.environ['RANK'], json.dumps(sorted(e.split(b'=')[0].decode() for e in start.split(b'\\0') if e)))")


def test_dry_run_lists_every_variable_an_instance_gets_besides_poprun_s_environment() -> None:
    """Before, the soft default IPUOF_LOG_LEVEL, POPRUN_CONSOLE_IS_TERMINAL and the guardian's
    POPRUN_GUARDIAN_TOKEN reached every instance and the listing left them out."""
    env = {k: v for k, v in os.environ.items() if k not in ("IPUOF_LOG_LEVEL", "POPRUN_CONSOLE_IS_TERMINAL")}
    launch = (*OFFLINE, "--mpi-local-args=-x PLAIN=visible")
    real = run_poprun(*launch, *PRINT_ENV_NAMES, env=env)
    assert real.returncode == 0, real.stderr
    lines = (line.split(" ", 1) for line in real.stdout.decode().splitlines())
    got = {int(rank): set(json.loads(names)) for rank, names in lines}
    dry = run_poprun("--dry-run", *launch, *PRINT_ENV_NAMES, env=env)
    assert dry.returncode == 0, dry.stderr
    out = dry.stdout.decode()
    for index in (0, 1):
        block = out.split(f"instance {index} on localhost:\n")[1].split("\ninstance ")[0]
        listed = set(re.findall(r"^    ([^=\s]+)=", block, re.M))
        assert got[index] == listed | set(env), (sorted(got[index] - listed - set(env)), sorted(listed - got[index]))
        assert {"    IPUOF_LOG_LEVEL=WARN", "    POPRUN_GUARDIAN_TOKEN=********",
                "    POPRUN_CONSOLE_IS_TERMINAL=(chosen at launch)"} <= set(block.splitlines()), block


def test_dry_run_on_several_hosts_connects_to_none() -> None:
    result = run_poprun("--dry-run", "--offline-mode", "-H", "localhost,node-that-does-not-exist",
                        "--num-instances", "2", "--num-replicas", "2", "python3", "x.py")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "instance 1 on node-that-does-not-exist:" in out
    assert "command: python3 x.py (found there by poprun's agent)" in out
    remote = out.split("instance 1 on node-that-does-not-exist:\n")[1]
    assert f"    PATH={os.environ['PATH']}\n" in remote and "    POPRUN_GUARDIAN_TOKEN=********\n" in remote  # forwarded


def test_a_host_files_slots_it_exceeds_are_said_not_silently_ignored(tmp_path: Path) -> None:
    """mpirun reads slots=N as a host's capacity; poprun places evenly (as Graphcore's), so a host given more than
    its slots gets a warning. Before, slots=N was parsed and dropped without a word, even with -v."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n")
    result = run_poprun("--offline-mode", "--host-file", str(hosts), "--num-instances", "2", "--num-replicas", "2",
                        "true")
    assert result.returncode == 0, result.stderr
    assert b"host localhost runs 2 instances, more than its slots=1" in result.stderr, result.stderr
    result = run_poprun("--offline-mode", "--host-file", str(hosts), "true")
    assert result.returncode == 0 and b"slots" not in result.stderr, result.stderr


def test_dry_run_shows_this_hosts_cpus_only_for_its_own_instances() -> None:
    """A remote host's agent binds its instances to its own NUMA nodes; before, the dry run showed this host's
    CPUs for them, a binding that did not exist."""
    result = run_poprun("--dry-run", "--offline-mode", "--numa-aware=yes", "-H", "localhost,node-that-does-not-exist",
                        "--num-instances", "2", "--num-replicas", "2", "true")
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.decode().split("instance ")[1:]
    assert "\n  cpus: " in blocks[0] and "placed on that host" not in blocks[0], blocks[0]
    assert "\n  cpus: placed on that host's NUMA nodes by its agent\n" in blocks[1], blocks[1]


def test_dry_run_is_not_saved_with_the_launch(tmp_path: Path) -> None:
    saved = tmp_path / "launch.json"
    assert run_poprun("--dry-run", "--offline-mode", "--export-config", str(saved)).returncode == 0
    assert "dry_run" not in saved.read_text()


#: poprun's dry run in this interpreter (its listing to stdout), then its exit code and the most memory it held
#: (the peak resident set, KiB) on stderr's last line.
DRY_RUN_PEAK = ("import resource, sys\nfrom poprun_py.command import main\ncode = main(sys.argv[1:])\n"
                "print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")


def dry_run_peak_kib(instances: int) -> int:
    count = str(instances)
    result = subprocess.run([sys.executable, "-c", DRY_RUN_PEAK, "--offline-mode=1", "--num-instances", count,
                             "--num-replicas", count, "--dry-run=yes", "true"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    code, peak = result.stderr.splitlines()[-1].split()
    assert (result.returncode, code) == (0, b"0"), result.stderr
    return int(peak)


def test_a_dry_run_s_memory_does_not_grow_with_its_instances() -> None:
    """Each instance is listed as it is planned. Before, every instance's plan and lines were made before the
    first was printed: 2,000 instances held 38 MB, 20,000 held 206 MB, and the 2**20 poprun accepts gigabytes."""
    few, many = dry_run_peak_kib(2_000), dry_run_peak_kib(20_000)
    assert many < few * 1.5, f"2,000 instances: {few} KiB at most; 20,000: {many} KiB"


# -- OMP_NUM_THREADS ------------------------------------------------------------------------------------
PRINT_OMP = (sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))")


def test_instances_sharing_a_host_get_their_share_of_the_cpus() -> None:
    env = {k: v for k, v in os.environ.items() if k != OMP_NUM_THREADS}
    result = run_poprun(*OFFLINE, "-v", *PRINT_OMP, env=env)
    assert result.returncode == 0, result.stderr
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert result.stdout.split() == [str(share).encode()] * 2
    assert result.stderr.count(b"POPRUN [I] OMP_NUM_THREADS=") == 1  # said once, at -v


def test_one_instance_on_a_host_is_left_alone() -> None:
    env = {k: v for k, v in os.environ.items() if k != OMP_NUM_THREADS}
    result = run_poprun("--offline-mode", *PRINT_OMP, env=env)
    assert result.stdout == b"None\n"


@pytest.mark.parametrize("how", ["environment", "-x"])
def test_a_value_the_user_set_is_kept(how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != OMP_NUM_THREADS}
    extra: tuple[str, ...] = ()
    if how == "environment":
        env[OMP_NUM_THREADS] = "3"
    else:
        extra = ("--mpi-local-args", "-x OMP_NUM_THREADS=3")
    result = run_poprun(*OFFLINE, "-v", *extra, *PRINT_OMP, env=env)
    assert result.stdout.split() == [b"3", b"3"] and b"POPRUN [I] OMP_NUM_THREADS=" not in result.stderr


def test_the_share_is_the_hosts_cpus_divided_among_its_instances() -> None:
    spec = build_spec({"offline_mode": "yes", "num_instances": 4, "num_replicas": 4, "host": ["a,b"]}, ["p"])
    plan = make_plan(spec.placement, spec.instance, programs=Programs(("p",)), job_id="j",
                     allocation=offline_allocation(spec.placement, spec.vipu), master_port=1,
                     launcher_environ={}, cwd="/", host_cpus={"a": 8})
    assert [i.env.get(OMP_NUM_THREADS) for i in plan.instances] == ["4", "4", None, None]  # b: its agent decides
    plan = make_plan(spec.placement, spec.instance, programs=Programs(("p",)), job_id="j",
                     allocation=offline_allocation(spec.placement, spec.vipu), master_port=1,
                     launcher_environ={OMP_NUM_THREADS: "2"}, cwd="/", host_cpus={"a": 8})
    assert [i.env.get(OMP_NUM_THREADS) for i in plan.instances] == [None, None, "2", "2"]  # a inherits it


def test_a_remote_agent_gives_the_same_share_on_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from poprun_py.executors.agent import _with_omp_share

    monkeypatch.delenv(OMP_NUM_THREADS, raising=False)
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert _with_omp_share({}, {}, 2) == {OMP_NUM_THREADS: share}
    assert _with_omp_share({OMP_NUM_THREADS: "5"}, {}, 2) == {OMP_NUM_THREADS: "5"}
    assert _with_omp_share({}, {}, 1) == {}


# -- --help ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def help_text() -> str:
    result = run_poprun("--help", env={**os.environ, "COLUMNS": "250", "NO_COLOR": "1"})
    assert result.returncode == 0
    return result.stdout.decode()


def test_help_says_what_each_value_is(help_text: str) -> None:
    assert "<str>" not in help_text and "TEXT" not in help_text and "<int>" not in help_text
    for flag in BOOLEAN_OPTIONS:
        assert re.search(re.escape(flag) + r"\s+\[yes\|no\]", help_text), flag
    assert re.search(r"--verbose\s+-v\s+More output; repeat", help_text)
    assert "[default:" not in help_text  # one style: (default: ...)
    assert "(default: ringswnc)" in help_text and "(default: ring)" in help_text
    assert "(default: pod-native-default)" in help_text
    assert "inside a Slurm allocation, its nodes" in help_text


def test_help_lists_every_exit_code_and_three_examples(help_text: str) -> None:
    epilog = help_text.split("Exit codes")[1]
    for code, meaning in exit_code_meanings().items():
        assert re.search(rf"^\s*{code}\s+{re.escape(meaning)}\s*$", epilog, re.MULTILINE), (code, meaning)
    examples = help_text.split("Examples:")[1]
    assert len(re.findall(r"^\s+poprun --", examples, re.MULTILINE)) == 3


def test_every_exit_code_has_its_meaning() -> None:
    assert set(_MEANINGS) == set(exit_codes())


# -- simipu ---------------------------------------------------------------------------------------------
def test_simipu_version_and_python_dash_m() -> None:
    import subprocess

    from poprun_py import __version__

    version = subprocess.run([sys.executable, "-m", "simipu", "--version"], capture_output=True, timeout=60)
    assert version.returncode == 0 and version.stdout.decode().strip() == f"simipu (poprun-py) {__version__}"
    listing = subprocess.run([sys.executable, "-m", "simipu", "vipu", "--help"], capture_output=True, timeout=60,
                             env={**os.environ, "COLUMNS": "200"})
    assert listing.returncode == 0 and b"list" in listing.stdout
    assert b"fail" not in listing.stdout and b"for tests" not in listing.stdout  # no test hooks shown


def test_dry_run_quotes_values_with_spaces_or_control_characters() -> None:
    """A value with a newline or spaces is shell-quoted, as the command line is (before: raw, a newline made a
    second line that looked like a malformed entry); plain values, paths and JSON stay as they are."""
    result = run_poprun("--offline-mode=1", "--dry-run=yes", "--mpi-local-args=-x FOO='a\nb' -x BAR='x y' -x BAZ=/p:q",
                        "true")
    assert result.returncode == 0, result.stderr
    assert "    FOO='a\nb'\n    " in result.stdout.decode()
    assert "    BAR='x y'\n" in result.stdout.decode() and "    BAZ=/p:q\n" in result.stdout.decode()
