"""A table of user mistakes: each is exit 2, one line on stderr, no traceback, nothing on stdout.

Every row runs the real ``poprun`` (``python -m poprun_py``); they fail while
the command line is read, before anything starts. The first rows are the
mistakes that used to exit 70 ("internal error"), crash every instance, or run
a job that could not work; ``tests/test_cli.py`` holds more rows of the same
kind (its ``BAD_INPUT``), none repeated here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poprun_py.errors import EXIT_USAGE
from poprun_py.spec import CONFIG_FORMAT
from support import run_poprun

O = "--offline-mode=1"  # noqa: E741  (one letter: the table below reads as command lines)
HUGE = str(2**70)
#: Saved launches (written to {d}/<name>.json): wrong JSON types, and programs too big to exec.
CONFIGS = {
    "list_as_string": ({"mpi_global_args": "--tag-output", "offline_mode": "yes"}, ["true"]),
    "hosts_as_string": ({"host": "a,b", "offline_mode": "yes"}, ["true"]),
    "options_as_list": ([], ["true"]),
    "verbose_as_text": ({"verbose": "x", "offline_mode": "yes"}, ["true"]),
    "program_as_string": ({"offline_mode": "yes"}, "true"),
    "program_of_numbers": ({"offline_mode": "yes"}, [1, 2]),
    "program_named_empty": ({"offline_mode": "yes"}, ["", "x"]),
    "program_with_nul": ({"offline_mode": "yes"}, ["echo", "a\0b"]),
    "cache_path_with_nul": ({"executable_cache_path": "a\0b", "offline_mode": "yes"}, ["true"]),
    "host_file_with_nul": ({"host_file": "a\0b", "offline_mode": "yes"}, ["true"]),
    "variable_with_nul": ({"mpi_local_args": ["-x A=a\0b"], "offline_mode": "yes"}, ["true"]),
    "program_with_surrogate": ({"offline_mode": "yes"}, ["echo", "\ud800"]),
    "variable_with_surrogate": ({"mpi_local_args": ["-x A=\ud800"], "offline_mode": "yes"}, ["true"]),
    "host_file_as_number": ({"host_file": 5, "offline_mode": "yes"}, ["true"]),
    "vv_as_text": ({"vv": "no", "offline_mode": "yes"}, ["true"]),
    "replicas_as_bool": ({"num_replicas": True, "offline_mode": "yes"}, ["true"]),
    "replicas_as_fraction": ({"num_replicas": 2.5, "offline_mode": "yes"}, ["true"]),
    "grace_as_text": ({"stop_grace": "inf", "offline_mode": "yes"}, ["true"]),
    "offline_as_object": ({"offline_mode": {"a": 1}}, ["true"]),
    "list_of_numbers": ({"mpi_local_args": [1], "offline_mode": "yes"}, ["true"]),
    "long_argument": ({"offline_mode": "yes"}, ["true", "x" * 200_000]),
    "over_arg_max": ({"offline_mode": "yes"}, ["true"] + ["x" * 100_000] * 25),
    "long_variable": ({"offline_mode": "yes", "mpi_local_args": ["-x A=" + "y" * 140_000]}, ["true"]),
    "huge_count": ({"num_instances": 2**70, "offline_mode": "yes"}, ["true"]),
    "timeout_zero": ({"timeout": 0, "offline_mode": "yes"}, ["true"]),
}

BAD_INPUT = [
    # -- used to exit 70, crash instances, or start a job that cannot work -------------------------
    ("--stop-grace inf", [O, "--stop-grace", "inf", "true"], b"--stop-grace: must be from 0 to 1000000 seconds"),
    ("--stop-grace 1e308", [O, "--stop-grace", "1e308", "true"], b"1000000 seconds"),
    ("--fabric-timeout inf", [O, "--fabric-timeout", "inf", "true"], b"--fabric-timeout: must be from 1 "),
    ("--fabric-timeout 1e308", [O, "--fabric-timeout", "1e308", "true"], b"1000000 seconds"),
    ("--fabric-timeout 1e9", [O, "--fabric-timeout", "1e9", "true"], b"1000000 seconds"),
    ("--fabric-timeout below heartbeat", [O, "--fabric-timeout", "0.5", "true"], b"four heartbeats"),
    ("--startup-timeout inf", [O, "--startup-timeout", "inf", "true"], b"--startup-timeout: must be more than 0"),
    ("--startup-timeout 1e308", [O, "--startup-timeout", "1e308", "true"], b"1000000 seconds"),
    ("--startup-timeout 1e10", [O, "--startup-timeout", "1e10", "true"], b"1000000 seconds"),
    ("--ssh-timeout inf", [O, "--ssh-timeout", "inf", "true"], b"--ssh-timeout"),
    ("--num-replicas 2**70", [O, "--num-replicas", HUGE, "true"], b"--num-replicas: must be at most 1048576"),
    ("--num-instances 2**70", [O, "--num-instances", HUGE, "--num-replicas", "2", "true"], b"--num-instances: must be at most"),
    ("--ipus-per-replica 2**70", [O, "--ipus-per-replica", HUGE, "true"], b"--ipus-per-replica: must be at most"),
    ("--num-ilds 2**70", [O, "--num-ilds", HUGE, "true"], b"--num-ilds: must be at most"),
    ("--vipu-server-timeout 2**70", [O, "--vipu-server-timeout", HUGE, "true"], b"--vipu-server-timeout: must be at most"),
    ("--vipu-partition-attempts 2**70", ["--vipu-partition-attempts", HUGE, "true"], b"must be at most"),
    ("replicas x IPUs too many", [O, "--num-replicas", "1048576", "--ipus-per-replica", "1048576", "true"], b"IPUs; at most"),
    ("--num-ilds not dividing the IPUs", [O, "--num-ilds", "3", "--num-replicas", "4", "true"], b"does not divide"),
    ("--output-filename under a file", [O, "--mpi-global-args", "--output-filename {d}/a_file/out", "true"], b"cannot create"),
    ("--output-filename in /proc", [O, "--mpi-local-args", "--output-filename /proc/poprun-out", "true"], b"--output-filename"),
    ("--output-filename empty", [O, "--mpi-global-args=--output-filename=", "true"], b"the directory is empty"),
    ("--output-filename DIR:typo", [O, "--mpi-global-args=--output-filename=out:nocpy", "true"], b"'nocpy'"),
    ("-H 120 KB", [O, "-H", "a" * 120_000, "true"], b"not a valid DNS name"),
    ("-H label of 64", [O, "-H", "a" * 64, "true"], b"not a valid DNS name"),
    ("-H name of 329", [O, "-H", ".".join(["abcdefghij"] * 30), "true"], b"at most 253 characters"),
    ("-H empty label", [O, "-H", "a..b", "true"], b"not a valid DNS name"),
    ("config: list as a string", ["--import-config", "{d}/list_as_string.json"], b"must be a list of strings"),
    ("config: hosts as a string", ["--import-config", "{d}/hosts_as_string.json"], b"'host' must be a list"),
    ("config: options as a list", ["--import-config", "{d}/options_as_list.json"], b"must be an object"),
    ("config: verbose as text", ["--import-config", "{d}/verbose_as_text.json"], b"'verbose' must be a whole number"),
    ("config: program as a string", ["--import-config", "{d}/program_as_string.json"], b"\"program\" must be a list"),
    ("config: program of numbers", ["--import-config", "{d}/program_of_numbers.json"], b"\"program\" must be a list"),
    ("config: NUL in an argument (was exit 70)", ["--import-config", "{d}/program_with_nul.json"],
     b"\"program\" contains a NUL character"),
    ("config: NUL in a path", ["--import-config", "{d}/cache_path_with_nul.json"], b"'executable_cache_path' contains a NUL"),
    ("config: NUL in a host file's name", ["--import-config", "{d}/host_file_with_nul.json"], b"'host_file' contains a NUL"),
    ("config: NUL in a variable", ["--import-config", "{d}/variable_with_nul.json"], b"'mpi_local_args' contains a NUL"),
    ("config: a lone surrogate in an argument (was exit 70)", ["--import-config", "{d}/program_with_surrogate.json"],
     b"\"program\" contains '\\ud800', a character utf-8 cannot encode"),
    ("config: a lone surrogate in a variable", ["--import-config", "{d}/variable_with_surrogate.json"],
     b"'mpi_local_args' contains '\\ud800'"),
    ("config: program named ''", ["--import-config", "{d}/program_named_empty.json"], b"the program's name is empty"),
    ("config: host_file as a number", ["--import-config", "{d}/host_file_as_number.json"], b"'host_file' must be a string"),
    ("config: vv as text", ["--import-config", "{d}/vv_as_text.json"], b"'vv' must be true or false"),
    ("config: replicas as a bool", ["--import-config", "{d}/replicas_as_bool.json"], b"must be a whole number"),
    ("config: replicas as a fraction", ["--import-config", "{d}/replicas_as_fraction.json"], b"must be a whole number"),
    ("config: grace as text", ["--import-config", "{d}/grace_as_text.json"], b"'stop_grace' must be a number"),
    ("config: offline as an object", ["--import-config", "{d}/offline_as_object.json"], b"'offline_mode' must be"),
    ("config: list of numbers", ["--import-config", "{d}/list_of_numbers.json"], b"list of strings"),
    ("config: count 2**70", ["--import-config", "{d}/huge_count.json"], b"--num-instances: must be at most"),
    ("config: a value out of bounds", ["--import-config", "{d}/timeout_zero.json"],
     b"got 0 (in --import-config '"),
    ("--export-config to a directory", [O, "--export-config", "{d}", "true"], b"is a directory; name a file"),
    ("argument over MAX_ARG_STRLEN", ["--import-config", "{d}/long_argument.json"], b"pass large data in a file"),
    ("arguments over ARG_MAX", ["--import-config", "{d}/over_arg_max.json"], b"ARG_MAX"),
    ("-x over MAX_ARG_STRLEN", ["--import-config", "{d}/long_variable.json"], b"environment variable A"),
    ("--dry-run --vipu-partition ../bad", ["--dry-run", "--vipu-partition", "../bad", "true"],
     b"--vipu-partition: invalid partition name '../bad'"),
    ("--dry-run --vipu-partition -x", ["--dry-run", "--vipu-partition", "-x", "true"], b"invalid partition name '-x'"),
    ("--dry-run --vipu-cluster ../c", ["--dry-run", "--vipu-cluster", "../c", "true"], b"--vipu-cluster: invalid cluster"),
    ("--dry-run --vipu-allocation 'a b'", ["--dry-run", "--vipu-allocation", "a b", "true"], b"--vipu-allocation: invalid"),
    ("--vipu-partition ../bad (was exit 77)", ["--vipu-partition", "../bad", "true"], b"invalid partition name"),
    ("--vipu-cluster with a slash", [O, "--vipu-cluster", "a/b", "true"], b"--vipu-cluster: invalid cluster name"),
    ("--vipu-cluster and a different --vipu-allocation (was: the cluster, silently)",
     ["--dry-run", "--vipu-cluster", "c1", "--vipu-allocation", "a1", "true"],
     b"--vipu-cluster c1 and --vipu-allocation a1 both name where partitions are created; give one of them"),
    ("--sync-type bogus", ["--sync-type", "bogus", "true"], b"--sync-type: sync type 'bogus' is not one of"),
    ("--ipu-link-routing-type bogus", ["--dry-run", "--ipu-link-routing-type", "bogus", "true"], b"not one of ringswnc"),
    ("--gw-link-routing-type bogus", [O, "--gw-link-routing-type", "bogus", "true"], b"--gw-link-routing-type: gw link"),
    # -- counts and numbers ------------------------------------------------------------------------
    ("--num-ilds 0", [O, "--num-ilds", "0", "true"], b"--num-ilds: must be at least 1"),
    ("--ipus-per-replica -3", [O, "--ipus-per-replica", "-3", "true"], b"at least 1"),
    ("--num-instances 0", [O, "--num-instances", "0", "true"], b"at least 1"),
    ("--num-instances 1.5", [O, "--num-instances", "1.5", "true"], b"not a valid int"),
    ("--num-replicas 1e3", [O, "--num-replicas", "1e3", "true"], b"not a valid int"),
    ("--num-replicas 5 of 2 instances", [O, "--num-instances", "2", "--num-replicas", "5", "true"], b"divided evenly"),
    ("--only-output-from-instance -1", [O, "--only-output-from-instance", "-1", "true"], b"at least 0"),
    ("--vipu-server-port 0", ["--vipu-server-port", "0", "true"], b"TCP port"),
    ("--vipu-server-timeout 0", ["--vipu-server-timeout", "0", "true"], b"must be at least 1 second, got 0"),
    ("--vipu-partition-attempts 0", ["--vipu-partition-attempts", "0", "true"], b"at least 1"),
    ("--vipu-server-host and -port disagree", ["--vipu-server-host", "127.0.0.1:18790", "--vipu-server-port", "18791",
                                               "true"], b"names port 18790 but --vipu-server-port is 18791"),
    ("--vipu-server-host a..b (was exit 70)", ["--vipu-server-host", "a..b", "true"],
     b"--vipu-server-host: host name 'a..b' is not a valid DNS name"),
    ("--dry-run --vipu-server-host of 300", ["--dry-run=yes", "--vipu-server-host", "a" * 300, "true"],
     b"--vipu-server-host: host name 'aaa"),
    ("--vipu-server-host label over 63 in IDNA", ["--vipu-server-host", "\u00fc" * 60 + ".example:8090", "true"],
     b"is not a valid DNS name"),
    ("--vipu-server-host port 99999", ["--vipu-server-host", "[::1]:99999", "true"], b"not a TCP port"),
    ("--vipu-server-host 127.0.0.1: (was accepted, as port 8090)", ["--dry-run", "--vipu-server-host", "127.0.0.1:",
                                                                   "true"], b"'127.0.0.1:': no port after ':'"),
    ("--vipu-server-host [::1]: (was accepted)", ["--vipu-server-host", "[::1]:", "true"], b"no port after ':'"),
    ("--vipu-server-host -h (was accepted)", ["--dry-run", "--vipu-server-host", "-h", "true"],
     b"--vipu-server-host: bad host name '-h': a host name cannot start with '-'"),
    ("--stop-grace -1", [O, "--stop-grace", "-1", "true"], b"--stop-grace"),
    ("--stop-grace nan", [O, "--stop-grace", "nan", "true"], b"got nan"),
    ("--stop-grace abc", [O, "--stop-grace", "abc", "true"], b"not a valid float"),
    ("--startup-timeout -5", [O, "--startup-timeout", "-5", "true"], b"--startup-timeout"),
    ("--ssh-timeout 0", [O, "--ssh-timeout", "0", "true"], b"--ssh-timeout"),
    # -- booleans and choices ----------------------------------------------------------------------
    ("--update-partition maybe", ["--update-partition=maybe", "true"], b"not a boolean"),
    ("--print-topology perhaps", [O, "--print-topology=perhaps", "true"], b"not a boolean"),
    ("--remove-partition 2", ["--remove-partition=2", "true"], b"not a boolean"),
    ("--reset-partition x", ["--reset-partition=x", "true"], b"not a boolean"),
    ("--allow-run-as-root sure", [O, "--allow-run-as-root=sure", "true"], b"not a boolean"),
    ("--overwrite-config maybe", [O, "--export-config", "{d}/saved.json", "--overwrite-config=maybe", "true"], b"not a boolean"),
    ("--fabric-transport udp", [O, "--fabric-transport", "udp", "true"], b"auto, tcp"),
    ("--process-placement numa", [O, "--process-placement", "numa", "true"], b"spreadnuma"),
    ("--vv=3", [O, "--vv=3", "true"], b"does not take a value"),
    ("misspelt option", [O, "--num-replica", "2", "true"], b"No such option"),
    ("program swallowed by a bare flag", [O, "--tag-output", "false"],
     b"no program given; usage: poprun [options] program [program args] (did you mean the program 'false'? "
     b"write --tag-output=yes false)"),
    # -- mpirun arguments --------------------------------------------------------------------------
    ("-x without a value", [O, "--mpi-local-args", "-x", "true"], b"-x needs a value"),
    ("-x =VALUE", [O, "--mpi-local-args", "-x =1", "true"], b"valid variable name"),
    ("-x A-B=1", [O, "--mpi-global-args", "-x A-B=1", "true"], b"valid variable name"),
    ("program inside --mpi-global-args", [O, "--mpi-global-args", "python3", "true"], b"is not an option"),
    ("instance args without an index", [O, "--instance-mpi-local-args", "-x A=1", "true"], b"<instance index>:<args>"),
    ("instance args with index -1", [O, "--instance-mpi-local-args=-1:-x A=1", "true"], b"<instance index>:<args>"),
    ("--bind-to core:nonsense", [O, "--mpi-local-args", "--bind-to core:nonsense", "true"], b"unknown qualifier"),
    ("-wdir that does not exist", [O, "--mpi-global-args", "-wdir {d}/nowhere", "true"], b"no such directory"),
    # -- hosts and host files ----------------------------------------------------------------------
    ("-H empty", [O, "-H", "", "true"], b"empty host list"),
    ("-H trailing comma", [O, "-H", "a,", "true"], b"extra comma"),
    ("-H port 99999", [O, "-H", "a:99999", "true"], b"bad port"),
    ("-H unclosed range", [O, "-H", "node[1-3", "true"], b"unclosed"),
    ("-H slash", [O, "-H", "no/de", "true"], b"bad host name"),
    ("-H -foo", [O, "-H", "-foo", "true"], b"cannot start with '-'"),
    ("-H=localhost (was: bad host name '=localhost')", [O, "-H=localhost", "true"],
     b"-H=localhost: a short option takes its value after a space, as in -H localhost"),
    ("-vH=a in a cluster (was: bad host name '=a')", [O, "-vH=a", "true"],
     b"-vH=a: a short option takes its value after a space, as in -vH a"),
    ("-vvH= in a cluster, no value (was: bad host name)", [O, "-vvH=", "true"],
     b"-vvH=: a short option takes its value after a space, as in -vvH VALUE"),
    ("-v=1 (was: No such option: -=)", [O, "-v=1", "true"],
     b"-v=1: option -v does not take a value; write -v alone (repeat it for more, as in -vv)"),
    ("-vv=2 (was: No such option: -=)", [O, "-vv=2", "true"], b"-vv=2: option -v does not take a value; write -vv alone"),
    ("-h=1 (was: No such option: -=)", [O, "-h=1", "true"], b"-h=1: option -h does not take a value; write -h alone"),
    ("--host-file naming -foo", [O, "--host-file", "{d}/hosts_dash", "true"], b"hosts_dash:2: bad host name '-foo'"),
    ("-H same host twice", [O, "-H", "a,A", "true"], b"appears twice"),
    ("-H this machine twice", [O, "-H", "localhost,127.0.0.1", "true"], b"are both this machine"),
    ("-H range of 10**8", [O, "-H", "n[0-99999999]", "true"], b"more than 65536 hosts"),
    ("--host-file missing", [O, "--host-file", "{d}/nowhere", "true"], b"cannot read host file"),
    ("--host-file a directory", [O, "--host-file", "{d}", "true"], b"Is a directory"),
    ("--host-file slots=0", [O, "--host-file", "{d}/hosts_slots0", "true"], b"bad slots value"),
    ("--host-file without hosts", [O, "--host-file", "{d}/hosts_none", "true"], b"lists no hosts"),
    ("--host-file not UTF-8", [O, "--host-file", "{d}/hosts_binary", "true"], b"not UTF-8"),
    # -- paths and strings -------------------------------------------------------------------------
    ("--executable-cache-path under a file", [O, "--executable-cache-path", "{d}/a_file/cache", "true"], b"cannot create"),
    ("--executable-cache-path a file", [O, "--executable-cache-path", "a_file", "true"], b"is not a directory"),
    ("--dry-run --executable-cache-path a file", [O, "--dry-run=yes", "--executable-cache-path", "a_file", "true"],
     b"/a_file' is not a directory"),  # as the launch refuses it, the path made absolute
    ("--dry-run --executable-cache-path under a file",
     [O, "--dry-run=yes", "--executable-cache-path", "{d}/a_file/cache", "true"], b"a_file' is not a directory"),
    ("--dry-run --executable-cache-path name too long (was exit 0)",
     [O, "--dry-run=yes", "--executable-cache-path", "{d}/" + "x" * 300, "true"], b"File name too long"),
    ("--dry-run --executable-cache-path path too long (was exit 0)",
     [O, "--dry-run=yes", "--executable-cache-path", "{d}/" + "/".join(["y" * 200] * 21), "true"],
     b"File name too long"),
    ("--executable-cache-path name too long", [O, "--executable-cache-path", "x" * 300, "true"],
     b"--executable-cache-path: cannot create"),
    ("--vipu-partition blank", ["--vipu-partition", " ", "true"], b"the value is empty"),
    ("--remote-python empty", [O, "--remote-python", "", "true"], b"the value is empty"),
    ("--export-config in a missing directory", [O, "--export-config", "{d}/nowhere/x.json", "true"], b"cannot write"),
    ("program named '' (was 126, 'is a directory')", [O, "", "x"], b"the program's name is empty (an unset variable?)"),
    ("program named '' and --export-config", [O, "--export-config", "{d}/new.json", "--", ""], b"program's name is empty"),
    ("--export-config name too long (was exit 70)", [O, "--export-config", "x" * 300, "true"],
     b"--export-config: cannot write 'xxx"),
    ("--import-config a directory", ["--import-config", "{d}"], b"cannot read"),
    ("--import-config empty", [O, "--import-config", "", "true"], b"--import-config: the value is empty"),
    ("--export-config empty", [O, "--export-config", "", "true"], b"--export-config: the value is empty"),
    ("--import-config not JSON", ["--import-config", "{d}/a_file"],
     b"a_file' is not a poprun-py config: not JSON (line 1, column 1: Expecting value)"),
    ("--import-config /dev/null (was: Expecting value: line 1 column 1)", ["--import-config", "/dev/null"],
     b"--import-config: '/dev/null' is not a poprun-py config: the file is empty, not JSON"),
    ("--import-config a number of 5000 digits (was: use sys.set_int_max_str_digits())",
     ["--import-config", "{d}/long_number.json"], b"long_number.json' is not a poprun-py config: it holds a number "
                                                  b"of 5000 digits"),
    ("--import-config not UTF-8", ["--import-config", "{d}/hosts_binary"], b"is not a poprun-py config: not text"),
    ("--import-config without format", ["--import-config", "{d}/no_format.json"], b"not a poprun-py config"),
    # -- files without end or depth: read up to a bound, not until memory runs out ----------------
    ("--import-config /dev/zero", ["--import-config", "/dev/zero", "true"], b"'/dev/zero' is larger than 4 MiB"),
    ("--import-config over 4 MiB", ["--import-config", "{d}/big.json"], b"is larger than 4 MiB"),
    ("--import-config nested deep", ["--import-config", "{d}/deep.json"], b"nested too deeply"),
    ("--host-file /dev/zero", [O, "--host-file", "/dev/zero", "true"], b"host file /dev/zero is larger than 4 MiB"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the rows name: configs, host files, a plain file where a directory belongs."""
    d = tmp_path_factory.mktemp("bad-input")
    (d / "a_file").write_text("not a directory\n")
    (d / "saved.json").write_text("{}\n")  # a row that would overwrite it must not touch the others' files
    (d / "hosts_slots0").write_text("node1 slots=0\n")
    (d / "hosts_none").write_text("# nothing but a comment\n")
    (d / "hosts_dash").write_text("node1\n-foo\n")
    (d / "hosts_binary").write_bytes(b"\xff\xfe\x00")
    (d / "no_format.json").write_text(json.dumps({"options": {}, "program": ["true"]}))
    long_number = json.dumps({"format": CONFIG_FORMAT, "options": {"num_replicas": 1}}).replace("1}", "9" * 5000 + "}")
    (d / "long_number.json").write_text(long_number)  # more digits than Python converts
    (d / "deep.json").write_text("[" * 200_000 + "]" * 200_000)  # RecursionError in json.loads
    (d / "big.json").write_text(json.dumps({"format": CONFIG_FORMAT, "options": {}, "program": ["x" * 2**22]}))
    for name, (options, program) in CONFIGS.items():
        (d / f"{name}.json").write_text(json.dumps({"format": CONFIG_FORMAT, "options": options, "program": program}))
    return d


def test_the_table_is_large_and_its_rows_distinct() -> None:
    from test_cli import BAD_INPUT as CLI_ROWS

    assert len(BAD_INPUT) >= 60
    assert len({name for name, _, _ in BAD_INPUT}) == len(BAD_INPUT)
    assert not {tuple(args) for _, args, _ in BAD_INPUT} & {tuple(args) for args, _ in CLI_ROWS}


@pytest.mark.parametrize("args, needle", [row[1:] for row in BAD_INPUT], ids=[row[0] for row in BAD_INPUT])
def test_a_mistake_is_one_line_exit_2_and_no_traceback(inputs: Path, args: list[str], needle: bytes) -> None:
    result = run_poprun(*(arg.replace("{d}", str(inputs)) for arg in args), cwd=inputs)
    lines = result.stderr.decode(errors="replace").splitlines()
    assert result.returncode == EXIT_USAGE, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("poprun: error: "), lines
    assert needle in result.stderr, lines[0]
    assert b"Traceback" not in result.stderr and result.stdout == b""


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "0", "-1"])
def test_an_instance_refuses_timeouts_the_command_line_would_have(value: str) -> None:
    """Set by hand, not by poprun: still a clear contract error naming the variable, not an OverflowError later."""
    from popdist.env import FABRIC_TIMEOUT, EnvContractError, FabricSettings

    with pytest.raises(EnvContractError, match=FABRIC_TIMEOUT):
        FabricSettings.from_environ({FABRIC_TIMEOUT: value})
