"""Hosts in network namespaces (tests/infra/netns.py): links that can be cut, a host behind a bastion.

Each host is its own network stack with its own sshd on port 22; poprun runs in the tests' (root)
namespace and reaches them over veth pairs and a bridge. Unlike the loopback aliases of
test_ssh.py, a host here can be cut off mid-job (its switch port taken down: silence, no RST), and
a host can sit behind a bastion, reachable only through it (ProxyJump). Root only; one set of
namespaces per module, removed after it even when a test fails.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Iterator

import pytest

from infra.netns import Network, assert_nothing_left_on, ip, unavailable_reason, write_ssh_home
from infra.sshd import MARKER
from poprun_py.executors.slurm import address_towards
from support import Launch, assert_all_gone, pids_of, python_program, read_line, run_poprun

OFFLINE = "--offline-mode=1"
FORWARD_MARKER = f"-x {MARKER}"  # remote instances join the test's leak check
ON_THE_SWITCH = ("nodeA", "nodeB", "nodeC", "bastion")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no network namespaces here: {reason}")
    with Network(tmp_path_factory.mktemp("netns")) as net:
        for name in ON_THE_SWITCH:
            net.add_host(name)
        net.add_host_behind("hidden", net.hosts["bastion"])
        yield net


@pytest.fixture
def home(network: Network, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME whose ~/.ssh/config names every host, the hidden one behind ``ProxyJump bastion``."""
    home = write_ssh_home(network, tmp_path, lambda host: "  ProxyJump bastion\n" if host.port is None else "")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def nothing_left_on_the_hosts(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test: no agent or instance on any host."""
    yield
    if "network" in request.fixturenames:
        assert_nothing_left_on(request.getfixturevalue("network"))


def json_lines(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith(b"{")]


def test_a_job_across_three_hosts_in_their_own_network_stacks(home: Path, network: Network) -> None:
    result = run_poprun("-H", "nodeA,nodeB,nodeC", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        "--num-instances", "3", "--num-replicas", "3", *python_program("collectives_check.py"))
    assert result.returncode == 0, result.stderr[-3000:]  # every collective checked against NumPy, over veth
    assert len(json_lines(result.stdout)) == 3


def test_a_link_cut_mid_collective(home: Path, network: Network) -> None:
    """Survivors hear of the loss from the fabric; poprun names the host within the keepalive bound;
    the cut-off host's agent, hearing nothing from poprun, stops its instance itself."""
    with open(home / ".ssh" / "config", "a") as config:  # poprun: lost within (4 + 1) x 2 s; its agent: 12 s
        config.write("Host *\n  ServerAliveInterval 2\n  ServerAliveCountMax 4\n")
    launch = Launch("-H", "nodeA,nodeB,nodeC", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                    "--num-instances", "3", "--num-replicas", "3", "--fabric-timeout", "3", "--stop-grace", "30",
                    *python_program("allreduce_until_lost.py"))
    pids = pids_of(launch.wait_for_lines(b"ready", 3))
    cut_off = network.hosts["nodeC"]
    network.cut(cut_off)
    try:
        rest = b"".join(iter(lambda: read_line(launch.process.stdout), b""))  # until poprun closes it (bounded)
        assert launch.finish(timeout=60) != 0
        stderr = launch.stderr.decode()
        assert ("lost nodeC: no answer to SSH keepalives for 8s (ServerAliveInterval 2 x ServerAliveCountMax 4)"
                in stderr), stderr
        survivors = sorted(json_lines(rest), key=lambda d: d["instance"])
        assert [s["instance"] for s in survivors] == [0, 1], stderr
        for survivor in survivors:
            assert survivor["error"] == "PeerLostError" and survivor["message"].startswith("instance 2 is gone: ")
        assert_all_gone(pids)  # nodeC's instance too, with its link still cut
    finally:
        network.mend(cut_off)


def test_proxyjump_through_a_bastion(home: Path, network: Network) -> None:
    hidden = network.hosts["hidden"]
    # no way there from here but the bastion: the only route that matches is the harness's unreachable one
    assert ip("-4", "route", "show", "match", hidden.address).splitlines()[-1].split()[0] == "unreachable"
    result = run_poprun("-H", "hidden", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    (line,) = json_lines(result.stdout)
    client, _, server, port = line["env"]["SSH_CONNECTION"].split()
    assert (client, server, port) == (network.inner(1), hidden.address, "22")  # it came from the bastion
    assert line["env"]["POPRUN_FABRIC_ADDR"] == hidden.address  # its address as its own sshd saw it


def test_a_proxyjump_chain(home: Path, network: Network) -> None:
    """``ProxyJump nodeA,bastion``: nodeA first, the bastion through nodeA, the target through the bastion."""
    hidden, bastion, first = network.hosts["hidden"], network.hosts["bastion"], network.hosts["nodeA"]
    assert hidden.sshd is not None and bastion.sshd is not None
    ssh = home / ".ssh"
    with open(ssh / "config", "a") as config:
        config.write(f"Host hidden-by-chain\n  HostName {hidden.address}\n  User {hidden.sshd.user}\n"
                     f"  IdentityFile {ssh}/id_hidden\n  IdentitiesOnly yes\n  ProxyJump nodeA,bastion\n")
    result = run_poprun("-H", "hidden-by-chain", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    (line,) = json_lines(result.stdout)
    assert line["env"]["SSH_CONNECTION"].split()[0] == network.inner(1)
    assert f"Connection from {first.address} port" in bastion.sshd.log_text()  # the bastion was reached via nodeA


def test_proxycommand_through_a_bastion(home: Path, network: Network) -> None:
    hidden, ssh = network.hosts["hidden"], home / ".ssh"
    assert hidden.sshd is not None
    with open(ssh / "config", "a") as config:
        config.write(f"Host hidden-by-command\n  HostName {hidden.address}\n  User {hidden.sshd.user}\n"
                     f"  IdentityFile {ssh}/id_hidden\n  IdentitiesOnly yes\n"
                     f"  ProxyCommand ssh -F {ssh}/config -W %h:%p bastion\n")
    result = run_poprun("-H", "hidden-by-command", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    (line,) = json_lines(result.stdout)
    client, _, server, _ = line["env"]["SSH_CONNECTION"].split()
    assert (client, server) == (network.inner(1), hidden.address)




def test_ctrl_c_while_a_hosts_link_is_cut_names_the_host(home: Path, network: Network) -> None:
    """Ctrl-C with nodeB cut off: poprun stops nodeA's instance and names nodeB as lost. Before, the summary
    counted nodeB's instance among those poprun stopped, which nobody saw (its agent stops it itself), and the
    warning at the grace period's end named the instance but not its host."""
    with open(home / ".ssh" / "config", "a") as config:  # poprun: lost within (4 + 1) x 2 s
        config.write("Host *\n  ServerAliveInterval 2\n  ServerAliveCountMax 4\n")
    launch = Launch("-H", "nodeA,nodeB", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                    "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "3",
                    *python_program("behave.py", "--ready", "--others", "sleep"))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    cut_off = network.hosts["nodeB"]
    network.cut(cut_off)
    try:
        launch.process.send_signal(signal.SIGINT)
        assert launch.finish(timeout=60) == 128 + signal.SIGINT
        stderr = launch.stderr.decode()
        assert "instance 1 (on nodeB) did not stop within 3s: sending SIGKILL" in stderr, stderr  # (the host named)
        assert "poprun received SIGINT and stopped the instances" in stderr, stderr
        assert "instances stopped by poprun as a consequence: 0\n" in stderr, stderr
        assert ("also failed: instance 1 on nodeB was lost: no answer to SSH keepalives for 8s "
                "(ServerAliveInterval 2 x ServerAliveCountMax 4)") in stderr, stderr
        assert_all_gone(pids)  # nodeB's instance too, its agent having heard nothing from poprun
    finally:
        network.mend(cut_off)


def test_the_address_a_node_reaches_us_by_is_the_one_on_the_route_to_it(network: Network) -> None:
    """Inside Slurm, poprun tells each node's instances where its rendezvous is: its address on the route to that
    node. Before, it was this host's name, which /etc/hosts may map to loopback (Debian's 127.0.1.1)."""
    assert address_towards(network.hosts["nodeA"].address) == network.outer(1)  # the switch's side of us
    assert address_towards("localhost") in {"127.0.0.1", "::1"}
    assert address_towards("no-such-node.invalid") == socket.gethostname()  # no route known: the name, as before
