"""The ``simipu`` command end to end: real processes, one-line errors, distinct exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from simipu.cli import EXIT_CODES
from simipu.devices import DeviceBusy
from simipu.vipu import (
    ClusterMismatch,
    InvalidPartitionRequest,
    NotEnoughIpus,
    PartitionExists,
    PartitionNotFound,
    PartitionTooLarge,
    VipuUnreachable,
)
from simipu.vipu.testing import server_process, start_server_process, stop_process

RUN_TIMEOUT = 30


def simipu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simipu.cli", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env=env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], error: type[BaseException]) -> None:
    assert result.returncode == EXIT_CODES[error], result
    assert result.stderr.startswith("simipu: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_exit_codes_are_distinct() -> None:
    by_type = {k: v for k, v in EXIT_CODES.items() if k.__name__ != "DeviceError"}
    assert len(set(by_type.values())) == len(by_type)
    assert not {0, 1, 2} & set(by_type.values())


def test_partition_lifecycle_on_a_state_file(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "vipu.sqlite")]
    created = simipu("vipu", "create", "partition", "p16", "--size", "16", "--num-gcds", "2", *state)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("create partition (p16): success.")
    assert simipu("vipu", "create", "partition", "r4", "--size", "4", "--reconfigurable",
                  "--ipu-link-routing-type", "dnc", *state).returncode == 0
    listed = simipu("vipu", "list", "partitions", *state)
    assert listed.stdout.splitlines()[0].split() == ["NAME", "CLUSTER", "SIZE", "ILDS", "GCDS", "RECONFIGURABLE",
                                                     "STATE", "IPUS"]
    assert listed.stdout.splitlines()[1].split() == ["p16", "cluster0", "16", "1", "2", "no", "PS_ACTIVE", "0-15"]
    as_json = json.loads(simipu("vipu", "list", "partitions", "--json", *state).stdout)
    assert [(p["name"], p["ipus"]) for p in as_json] == [("p16", list(range(16))), ("r4", [16, 17, 18, 19])]
    shown = json.loads(simipu("vipu", "show", "partition", "r4", "--json", *state).stdout)
    assert shown["ipu_link_routing_type"] == "dnc" and shown["sync_type"] == "c2-compatible"
    assert "parent device id : 30" in simipu("vipu", "show", "partition", "p16", *state).stdout
    assert "PS_FAILED" in simipu("vipu", "fail", "partition", "p16", *state).stdout
    assert "PS_ACTIVE" in simipu("vipu", "reset", "partition", "p16", *state).stdout
    assert simipu("vipu", "remove", "partition", "p16", *state).stdout == "remove partition (p16): success.\n"
    assert [p["name"] for p in json.loads(simipu("vipu", "list", "partitions", "--json", *state).stdout)] == ["r4"]
    clusters = simipu("vipu", "list", "clusters", *state).stdout.splitlines()
    assert clusters[1].split() == ["cluster0", "64", "1", "16"]


def test_errors_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "vipu.sqlite")]
    assert simipu("vipu", "create", "partition", "p32", "--size", "32", *state).returncode == 0
    assert_one_line_error(simipu("vipu", "create", "partition", "p32", "--size", "4", *state), PartitionExists)
    assert_one_line_error(simipu("vipu", "create", "partition", "big", "--size", "128", *state), PartitionTooLarge)
    assert_one_line_error(simipu("vipu", "create", "partition", "q", "--size", "64", *state), NotEnoughIpus)
    assert_one_line_error(simipu("vipu", "create", "partition", "odd", "--size", "3", *state),
                          InvalidPartitionRequest)
    assert_one_line_error(simipu("vipu", "show", "partition", "ghost", *state), PartitionNotFound)
    assert_one_line_error(simipu("vipu", "remove", "partition", "ghost", *state), PartitionNotFound)
    assert_one_line_error(simipu("vipu-server", "--port", "0", "--cluster", "pod16", *state), ClusterMismatch)
    usage = simipu("vipu", "list", "partitions", "--server", "h:notaport")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    both = simipu("vipu", "list", "partitions", "--server", "127.0.0.1", *state)
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_unreachable_server(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = simipu("vipu", "list", "partitions", "--server", f"127.0.0.1:{port}", "--timeout", "5")
    assert_one_line_error(result, VipuUnreachable)
    assert f"127.0.0.1:{port}" in result.stderr


def test_default_state_is_in_xdg_state_home(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    assert simipu("vipu", "create", "partition", "p", "--size", "2", env=env).returncode == 0
    assert (tmp_path / "xdg" / "poprun-py" / "vipu.sqlite").is_file()
    assert "p " in simipu("vipu", "list", "partitions", env=env).stdout


def test_info_lists_devices_and_holders(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "vipu.sqlite")]
    empty = simipu("info", *state, "--device-dir", str(tmp_path / "devices"))
    assert empty.stdout.startswith("Graphcore device listing:") and "No partitions" in empty.stdout
    simipu("vipu", "create", "partition", "p4", "--size", "4", *state)
    lines = simipu("info", *state, "--device-dir", str(tmp_path / "devices")).stdout.splitlines()
    assert "Partition: p4 [active]" in lines and "-+- Id: [6], target: [Multi IPU]" in lines
    assert sum(line.startswith("-+- Id:") for line in lines) == 7


def test_commands_through_a_server(tmp_path: Path) -> None:
    with server_process(tmp_path / "vipu.sqlite", cluster="pod16") as server:
        at = ["--server", server.address]
        assert simipu("vipu", "create", "partition", "p8", "--size", "8", *at).returncode == 0
        assert_one_line_error(simipu("vipu", "create", "partition", "p32", "--size", "32", *at), PartitionTooLarge)
        assert json.loads(simipu("vipu", "show", "partition", "p8", "--json", *at).stdout)["ipus"] == list(range(8))
        assert "Partition: p8 [active]" in simipu("info", *at).stdout
        assert simipu("vipu", "list", "clusters", *at).stdout.splitlines()[1].split()[:2] == ["cluster0", "16"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_server_exits_cleanly_on_signal(tmp_path: Path, stop: signal.Signals) -> None:
    server = start_server_process(tmp_path / "vipu.sqlite")
    try:
        server.process.send_signal(stop)
        out, err = server.process.communicate(timeout=RUN_TIMEOUT)
        assert server.process.returncode == 0, err
        assert out.endswith(b"stopped\n") and b"Traceback" not in err
    finally:
        stop_process(server.process)


def test_server_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = simipu("vipu-server", "--port", str(port), "--state", str(tmp_path / "s.sqlite"))
    assert result.returncode == 14 and result.stderr.count("\n") == 1 and f":{port}" in result.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "simipu"
    assert script.exists(), "run `pip install -e .` to install the simipu console script"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0 and "vipu-server" in result.stdout


def test_device_busy_has_its_own_code() -> None:
    assert EXIT_CODES[DeviceBusy] == 13


@pytest.mark.parametrize("args", [["vipu", "create", "partition"], ["vipu", "create", "partition", "p", "--size", "x"],
                                  ["no-such-command"]])
def test_usage_errors_are_one_line(args: list[str], tmp_path: Path) -> None:
    result = simipu(*args, "--state", str(tmp_path / "s.sqlite")) if args[0] == "vipu" else simipu(*args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("simipu: error:")


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "1e7"])
@pytest.mark.parametrize("option", ["--io-timeout", "--request-deadline", "--timeout"])
def test_a_duration_that_bounds_nothing_is_a_usage_error(option: str, value: str, tmp_path: Path) -> None:
    """nan was an internal error (exit 70); inf, 1e400 (inf once parsed) and 1e7 switched the server's bounds off."""
    if option == "--timeout":
        command = ["vipu", "list", "partitions", "--server", "127.0.0.1:1"]
    else:  # refused, it never listens; were it taken, the server would serve until RUN_TIMEOUT kills it
        command = ["vipu-server", "--port", "0", "--state", str(tmp_path / "vipu.sqlite")]
    result = simipu(*command, option, value)
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"'{option}': must be from 0.001 to 1000000 seconds, got " in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("limits", [{"io_timeout": float("nan")}, {"request_deadline": float("inf")},
                                    {"io_timeout": 1e7}, {"max_connections": 0}])
def test_server_limits_refuse_a_bound_that_is_none(limits: dict[str, float]) -> None:
    from simipu.vipu.server import ServerLimits

    with pytest.raises(ValueError, match=f"server limits: {next(iter(limits))} must be"):
        ServerLimits(**limits)  # type: ignore[arg-type]
