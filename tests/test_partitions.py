"""poprun on the simulated IPU system: partitions as the guide describes them, errors, concurrency."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra.sshd import MARKER
from poprun_py import errors
from simipu.vipu import PartitionRequest, VipuService
from simipu.vipu.testing import server_process
from support import poprun_command, python_program, read_line, run_poprun, skip_without_ipv6_loopback


def state_file() -> str:
    return os.path.join(os.environ["XDG_STATE_HOME"], "poprun-py", "vipu.sqlite")


def partitions() -> dict[str, object]:
    return {p.name: p for p in VipuService(state_file()).list_partitions()}


def env_of(result: subprocess.CompletedProcess[bytes]) -> list[dict]:
    assert result.returncode == 0, result.stderr.decode()
    return sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda r: r["api"]["instance"])


def test_embedded_service_creates_and_removes_a_temporary_partition() -> None:
    records = env_of(run_poprun("-v", "--num-instances", "4", "--num-replicas", "8", "--ipus-per-replica", "2",
                                *python_program("print_env.py")))
    env = records[0]["env"]
    assert env["IPUOF_VIPU_API_PARTITION_ID"].startswith("poprun-")
    assert env["POPDIST_NODE_DEVICE_ID"] == "30"  # the 16-IPU parent device: 2N - 2
    assert [r["api"]["device_id"] for r in records] == [24, 25, 26, 27]
    assert json.loads(env["POPLAR_TARGET_OPTIONS"])["gatewayMode"] == "true"
    assert env["POPRUN_OFFLINE"] == "0"
    assert partitions() == {}  # removed at the end (--remove-partition defaults to yes)


def test_the_embedded_service_gives_instances_no_server_address() -> None:
    """Before, instances were told IPUOF_VIPU_API_HOST=localhost, _PORT=8090: a server that was not there, or was
    someone else's. A server named in poprun's own environment (an outer launch's) is not passed on either."""
    outer = {**os.environ, "IPUOF_VIPU_API_HOST": "vipu.elsewhere", "IPUOF_VIPU_API_PORT": "8090"}
    for offline in ((), ("--offline-mode",)):
        env = env_of(run_poprun(*offline, "--num-instances", "2", "--num-replicas", "2",
                                *python_program("print_env.py"), env=outer))[1]["env"]
        assert "IPUOF_VIPU_API_HOST" not in env and "IPUOF_VIPU_API_PORT" not in env, env
        assert env["IPUOF_VIPU_API_PARTITION_ID"]


def test_named_partition_is_created_kept_and_reused() -> None:
    first = run_poprun("-v", "--vipu-partition", "p4", "--remove-partition=no", "--num-replicas", "4", "true")
    assert first.returncode == 0 and b"Created partition p4 with 4 IPUs" in first.stderr
    assert list(partitions()) == ["p4"]
    again = run_poprun("-v", "--vipu-partition", "p4", "--num-replicas", "4", "true")
    assert again.returncode == 0
    assert b"Partition p4 already exists and is in state: PS_ACTIVE" in again.stderr
    assert b"Resetting partition p4" in again.stderr  # non-reconfigurable: reset by default
    assert list(partitions()) == ["p4"]  # poprun did not create it, so it does not remove it


def test_a_partition_that_does_not_fit_needs_update_partition() -> None:
    assert run_poprun("--vipu-partition", "p", "--remove-partition=no", "--num-replicas", "4", "true").returncode == 0
    refused = run_poprun("--vipu-partition", "p", "--num-replicas", "8", "true")
    assert refused.returncode == errors.EXIT_PARTITION_MISMATCH
    assert len(refused.stderr.splitlines()) == 1 and b"--update-partition=yes" in refused.stderr
    updated = run_poprun("-v", "--vipu-partition", "p", "--num-replicas", "8", "--update-partition=yes", "true")
    assert updated.returncode == 0 and b"Updating partition p" in updated.stderr
    assert partitions()["p"].size == 8


def test_failed_partition_is_reset_by_default_and_refused_without_reset() -> None:
    assert run_poprun("--vipu-partition", "p", "--remove-partition=no", "--num-replicas", "2", "true").returncode == 0
    VipuService(state_file()).mark_failed("p")
    refused = run_poprun("--vipu-partition", "p", "--reset-partition=no", "--num-replicas", "2", "true")
    assert refused.returncode == errors.EXIT_PARTITION_FAILED and b"PS_FAILED" in refused.stderr
    assert run_poprun("--vipu-partition", "p", "--num-replicas", "2", "true").returncode == 0


def test_reconfigurable_partition_is_not_reset_by_default() -> None:
    VipuService(state_file()).create_partition(
        PartitionRequest("r", 2, num_gcds=1, reconfigurable=True, sync_type="c2-compatible"))
    result = run_poprun("-v", "--vipu-partition", "r", "--num-replicas", "2", "true")
    assert result.returncode == 0 and b"Resetting" not in result.stderr


def test_the_only_fitting_partition_is_used_without_a_name() -> None:
    VipuService(state_file()).create_partition(PartitionRequest("only", 4, num_gcds=2))
    result = run_poprun("-v", "--num-instances", "2", "--num-replicas", "4", "true")
    assert result.returncode == 0
    assert b"Using V-IPU partition only as it is the only one available" in result.stderr
    assert list(partitions()) == ["only"]


def test_partition_larger_than_the_cluster() -> None:
    result = run_poprun("--num-replicas", "128", "true")
    assert result.returncode == errors.EXIT_PARTITION_TOO_LARGE
    assert len(result.stderr.splitlines()) == 1


def test_dry_run_refuses_a_partition_size_as_the_launch_does() -> None:
    """Before, --dry-run crashed on it (exit 70, "internal error") where the launch said what was wrong."""
    args = ("--vipu-partition", "p6", "--ipus-per-replica", "3", "--num-instances", "2", "--num-replicas", "2", "true")
    launched, dry = run_poprun(*args), run_poprun("--dry-run", *args)
    for result in (launched, dry):
        assert result.returncode == errors.EXIT_VIPU_ERROR, result.stderr
        assert result.stderr.decode().splitlines() == [
            "poprun: error: partition p6: size 6 is not a power of two; V-IPU partitions have 1, 2, 4, 8, ... IPUs"]
    assert partitions() == {}


def test_unreachable_server_fails_within_the_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused at once
        result = run_poprun("--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(port),
                            "--vipu-server-timeout", "2", "true", timeout=20)
    assert result.returncode == errors.EXIT_VIPU_UNREACHABLE
    assert len(result.stderr.splitlines()) == 1 and str(port).encode() in result.stderr


def guide_line(name: str, server: str) -> list[str]:
    lines = {
        "single instance": f"--numa-aware=yes --vipu-server-host={server} --vipu-partition=P8 --vipu-cluster=A8 "
                           '--mpi-global-args="--tag-output" --num-replicas=4 --num-instances=1',
        "multi instance single host": f"--numa-aware=yes --vipu-server-host={server} --vipu-partition=A8 "
                                      '--vipu-cluster=A8 --mpi-global-args="--tag-output" --num-replicas=8 --num-instances=2',
        # the guide's multi-host lines, with its two hosts replaced by nodeA and nodeB (the fixture ``home``),
        # and the test's leak-check marker passed on to their instances
        "multi instance multi host": f"--host nodeA,nodeB --numa-aware=yes --vipu-server-host={server} "
                                     "--vipu-partition=P8 --vipu-cluster=A8 --num-ilds=1 "
                                     f'--mpi-global-args="--tag-output -x {MARKER}" '
                                     '--mpi-local-args="-x PYTHONPATH" --num-replicas=8 --num-instances=2',
        "multi pod": f"--host nodeA,nodeB --numa-aware=yes --vipu-server-host={server} --vipu-partition=P8 "
                     f'--vipu-cluster=P8 --num-ilds=2 --mpi-global-args="--tag-output -x {MARKER}" '
                     '--mpi-local-args="-x PYTHONPATH" --num-replicas=8 --num-instances=2',
    }
    return shlex.split(lines[name])


@pytest.mark.parametrize("name", ["single instance", "multi instance single host"])
def test_guide_launch_lines_against_a_real_vipu_server(tmp_path, name: str) -> None:
    run_guide_line(tmp_path, name)


@pytest.mark.parametrize("name", ["multi instance multi host", "multi pod"])
def test_guide_multi_host_launch_lines_against_a_real_vipu_server(tmp_path, name: str, home) -> None:
    """Over SSH to nodeA and nodeB (two names of this machine would be one host, refused as such)."""
    run_guide_line(tmp_path, name)


def run_guide_line(tmp_path, name: str) -> None:
    state = tmp_path / "vipu.sqlite"
    VipuService(state, cluster="pod64", cluster_name="A8")  # the guide's clusters
    VipuService(state, cluster="pod128", cluster_name="P8")  # two ILDs for the multi-POD line
    with server_process(state) as server:
        args = guide_line(name, "127.0.0.1")
        result = run_poprun(*args, "--vipu-server-port", str(server.port), *python_program("collectives_check.py"))
        assert result.returncode == 0, result.stderr.decode()
        result = run_poprun(*args, "--vipu-server-port", str(server.port), *python_program("print_env.py"))
        assert result.returncode == 0, result.stderr.decode()
        lines = [line.split(b"]<stdout>:", 1)[1] for line in result.stdout.splitlines()]
        env = json.loads(lines[0])["env"]
        assert env["IPUOF_VIPU_API_HOST"] == "127.0.0.1" and env["IPUOF_VIPU_API_PORT"] == str(server.port)
        assert env["IPUOF_VIPU_API_PARTITION_ID"] in ("P8", "A8")
        assert VipuService(state).list_partitions() == []  # created by poprun, removed at the end


@pytest.mark.parametrize("where", ["[::1]", "::1", "[::1]:PORT"])
def test_poprun_uses_a_vipu_server_on_ipv6(tmp_path, where: str) -> None:
    """The address as simipu's --server takes it; before, '[::1]' was an unknown host (exit 74)."""
    skip_without_ipv6_loopback()
    with server_process(tmp_path / "vipu.sqlite", host="::1") as server:
        port = () if "PORT" in where else ("--vipu-server-port", str(server.port))
        result = run_poprun("--vipu-server-host", where.replace("PORT", str(server.port)), *port,
                            "--num-replicas", "2", *python_program("print_env.py"))
        env = env_of(result)[0]["env"]
        assert (env["IPUOF_VIPU_API_HOST"], env["IPUOF_VIPU_API_PORT"]) == ("::1", str(server.port))
        assert server.client().list_partitions() == []  # made for the launch, removed after it


@pytest.mark.parametrize("where", ["--vipu-server-port", "HOST:PORT"])
def test_poprun_says_a_web_server_is_not_a_vipu_server(tmp_path, where: str) -> None:
    """Before: "answered HTTP 404", exit 77 (a refusal by the V-IPU service), and HOST:PORT became HOST:PORT:8090."""
    from test_vipu_server import web_server

    with web_server(tmp_path) as port:
        address = ("127.0.0.1", "--vipu-server-port", str(port)) if where == "--vipu-server-port" else (f"127.0.0.1:{port}",)
        result = run_poprun("--vipu-server-host", *address, "--num-replicas", "2", "true")
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_VIPU_UNREACHABLE, lines
    assert len(lines) == 1 and lines[0].startswith(f"poprun: error: 127.0.0.1:{port} is not a V-IPU server (HTTP 404 "
                                                   "for /v1/partitions, Server: SimpleHTTP/"), lines


def test_concurrent_launches_never_share_ipus(tmp_path) -> None:
    state = tmp_path / "vipu.sqlite"
    VipuService(state, cluster="pod16")
    with server_process(state) as server:
        def launch(i: int) -> int:
            return subprocess.run(poprun_command(
                "--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server.port),
                "--vipu-partition", f"job{i}", "--remove-partition=no", "--num-replicas", "4", "true"),
                capture_output=True, timeout=60).returncode
        with ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(launch, range(6)))
        owned = [p.ipus for p in VipuService(state).list_partitions()]
    # a POD16 has room for four 4-IPU partitions: four launches win, two are told there is no room
    assert sorted(codes) == [0, 0, 0, 0, errors.EXIT_NO_DEVICES, errors.EXIT_NO_DEVICES]
    flat = [ipu for ipus in owned for ipu in ipus]
    assert len(flat) == len(set(flat)) == 16


def test_instances_hold_their_devices_exclusively(tmp_path) -> None:
    from simipu.devices import DeviceBusy, attach

    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    release = os.open(fifo, os.O_RDWR)  # a writer from the start: the instances' opens never block
    launch = subprocess.Popen(
        poprun_command("--vipu-partition", "p", "--remove-partition=no", "--num-instances", "2", "--num-replicas", "2",
                       *python_program("hold_device.py")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "HOLD_GO_FIFO": str(fifo)})
    try:
        pids = {}
        while len(pids) < 2:
            line = read_line(launch.stdout)
            assert line, launch.stderr.read()
            _, index, pid = line.split()
            pids[int(index)] = int(pid)
        partition = VipuService(state_file()).get_partition("p")
        for index in (0, 1):  # device 2N - 2N/S + i with N=2, S=1: the single IPUs 0 and 1
            with pytest.raises(DeviceBusy) as busy:
                attach(partition, index)
            assert busy.value.holder.pid == pids[index]  # the instance itself, not poprun
    finally:
        os.close(release)  # end-of-file for every instance: both finish
        code = launch.wait(60)
    assert code == 0
    with attach(VipuService(state_file()).get_partition("p")) as device:  # free again
        assert device.ipus == (0, 1)


def test_a_held_ipu_stops_the_launch_before_any_instance_starts(tmp_path) -> None:
    from simipu.devices import attach

    VipuService(state_file()).create_partition(PartitionRequest("p", 2, num_gcds=2))
    with attach(VipuService(state_file()).get_partition("p"), 1):  # someone else holds IPU 1
        result = run_poprun("--vipu-partition", "p", "--num-instances", "2", "--num-replicas", "2",
                            "sh", "-c", "echo started")
    assert result.returncode == errors.EXIT_NO_DEVICES
    assert result.stdout == b""  # phase 1 failed: no instance ran (no late failure in phase 2)
    assert str(os.getpid()).encode() in result.stderr  # the holder is named


def test_every_partition_flag_reaches_the_partition() -> None:
    VipuService(state_file(), cluster="pod128", cluster_name="big")
    result = run_poprun("--vipu-partition", "p", "--remove-partition=no", "--vipu-cluster", "big", "--num-ilds", "2",
                        "--num-instances", "2", "--num-replicas", "8", "--ipus-per-replica", "16",
                        "--ipu-link-routing-type", "dor", "--gw-link-routing-type", "ringswnc",
                        "--sync-type", "pod-native-gw", *python_program("print_env.py"))
    records = env_of(result)
    partition = partitions()["p"]
    assert (partition.cluster, partition.size, partition.num_ilds, partition.num_gcds) == ("big", 128, 2, 2)
    assert (partition.ipu_link_routing_type, partition.gw_link_routing_type, partition.sync_type) == (
        "dor", "ringswnc", "pod-native-gw")
    options = json.loads(records[0]["env"]["POPLAR_TARGET_OPTIONS"])
    assert options["ipuLinkDomainSize"] == "64" and options["instanceSize"] == "64"
    assert [r["api"]["device_id"] for r in records] == [252, 253]  # 2N - 2N/S + i with N=128, S=64
    assert records[0]["env"]["POPDIST_NODE_DEVICE_ID"] == "254"


def test_vipu_allocation_names_the_cluster_too() -> None:
    VipuService(state_file(), cluster="pod16", cluster_name="alloc1")
    result = run_poprun("--vipu-partition", "q", "--remove-partition=no", "--vipu-allocation", "alloc1",
                        "--num-replicas", "4", "true")
    assert result.returncode == 0, result.stderr
    assert partitions()["q"].cluster == "alloc1"
