"""Hosts reachable over IPv6 only, in network namespaces (tests/infra/netns.py, ``ipv6=True``).

Such a host gives poprun an IPv6 address to run the job's rendezvous on, and the instances IPv6
addresses to listen on and to reach each other at (simipu/fabric/join/addresses.py): a job must
run there as it does over IPv4, with every form of ``-H`` an IPv6 host takes. Root only; one
network of two hosts for the module, removed after it even when a test fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from infra.netns import Network, assert_nothing_left_on, unavailable_reason, write_ssh_home
from infra.sshd import MARKER
from support import python_program, run_poprun

OFFLINE = "--offline-mode=1"
FORWARD_MARKER = f"-x {MARKER}"  # remote instances join the test's leak check


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no network namespaces here: {reason}")
    with Network(tmp_path_factory.mktemp("netns6"), ipv6=True) as net:
        net.add_host("v6a")
        net.add_host("v6b")
        yield net


@pytest.fixture
def home(network: Network, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME whose ~/.ssh/config names each host by an alias and by its IPv6 address."""
    home = write_ssh_home(network, tmp_path, also_named=lambda host: host.address)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def nothing_left_on_the_hosts(network: Network) -> Iterator[None]:
    """After each test: no agent or instance on either host."""
    yield
    assert_nothing_left_on(network)


def allreduce_lines(stdout: bytes, instances: int) -> list[str]:
    """mpi_allreduce.py's lines, in rank order; each rank adds rank + 1."""
    total = instances * (instances + 1) // 2
    lines = sorted(line for line in stdout.decode().splitlines() if line.startswith("rank "))
    assert lines == [f"rank {r} of {instances}: allreduce {total} Allreduce {float(total)} (popdist.mpi4py.MPI)"
                     for r in range(instances)], stdout
    return lines


def test_a_job_across_two_ipv6_only_hosts_over_tcp(home: Path, network: Network) -> None:
    """By alias and as ``user@[address]:port``; every link TCP over IPv6, the same host's too."""
    second = network.hosts["v6b"]
    assert second.sshd is not None
    result = run_poprun("-H", f"v6a,{second.sshd.user}@[{second.address}]:22", OFFLINE,
                        "--mpi-global-args", FORWARD_MARKER, "--num-instances", "4", "--num-replicas", "4",
                        "--fabric-transport=tcp", *python_program("mpi_allreduce.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    allreduce_lines(result.stdout, 4)


@pytest.mark.parametrize("form", ["{address}", "[{address}]", "{user}@{address}"])
def test_this_host_and_an_ipv6_only_host(home: Path, network: Network, form: str) -> None:
    """The local instance listens at this host's IPv6 address, as the remote host reaches it."""
    host = network.hosts["v6b"]
    assert host.sshd is not None
    result = run_poprun("-H", "localhost," + form.format(address=host.address, user=host.sshd.user), OFFLINE,
                        "--mpi-global-args", FORWARD_MARKER, "--num-instances", "2", "--num-replicas", "2",
                        *python_program("mpi_allreduce.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    allreduce_lines(result.stdout, 2)
