"""Hosts in network namespaces: separate network stacks joined by links a test can cut.

Why: loopback aliases (tests/infra/sshd.py) share one network stack, so nothing between them can
fail. Here every host is a network namespace with its own sshd (on port 22, as on a real host),
plugged into a switch: a bridge in a namespace of its own. The tests' own (root) namespace, where
poprun runs, is plugged in too, so it reaches every host over veth and the bridge, and a test cuts a
host off by taking its switch port down (``ip link set ... down``), like pulling a cable: no RST,
no FIN, just silence. A host can also sit behind another (a bastion): linked to it alone, on a
network the root namespace has no route to.

Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range, never routed on real networks):
one /24 per network, chosen under a lock among those no interface here uses, so concurrent test
runs never share one. A network made with ``ipv6=True`` gives its hosts on the switch IPv6
addresses only, from the unique-local /64 ``fd00:5050:<that /24's number>::`` (so it is as free as
the /24), and the root namespace one there beside its IPv4 address; all with ``nodad``: usable at
once, with no duplicate-address detection to wait for. Names carry the pid. Everything is made as
root and removed by ``close()``, which a ``with`` block or fixture calls even when a test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil

from infra.sshd import MARKER, SshServer, wait_gone
from infra.sshd import unavailable_reason as sshd_unavailable

IP = shutil.which("ip") or "/usr/sbin/ip"
LOCK = Path("/run/lock/poprun-test-netns.lock")
_SERIALS = itertools.count()
TIMEOUT = 30.0


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can): for ``pytest.skip``."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.access(IP, os.X_OK):
        return "ip not found (apt-get install iproute2; scripts/test.sh does when run as root)"
    reason = sshd_unavailable(())
    if reason:
        return reason
    probe = f"poprun-probe-{os.getpid()}"
    made = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True, timeout=TIMEOUT)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run([IP, "netns", "delete", probe], capture_output=True, timeout=TIMEOUT)
    return None


def ip(*args: str) -> str:
    """Run ``ip``; a failure raises with ip's own message."""
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class NetHost:
    """One host: its namespace, its address, the switch port that links it, and its sshd."""

    name: str
    netns: str
    address: str
    port: str | None  # the switch port (None for a host behind a bastion)
    sshd: SshServer | None = None


class Network:
    """A switch, the root namespace's link to it, and hosts; ``close`` removes them all."""

    def __init__(self, state_dir: Path, ipv6: bool = False) -> None:
        self.state_dir = state_dir
        self.ipv6 = ipv6
        serial = next(_SERIALS)  # two networks of one process never share a name either
        self.tag = f"{os.getpid():x}{serial:x}"  # interface names must fit in 15 characters
        self.prefix = f"poprun-{os.getpid()}-{serial}"
        self.switch = f"{self.prefix}-switch"
        self.namespaces: list[str] = []
        self.hosts: dict[str, NetHost] = {}
        self.root_link = f"p{self.tag}r"
        self.subnet = -1

    # -- building ------------------------------------------------------------------------
    def __enter__(self) -> Network:
        try:
            self._namespace(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            with self._subnet_lock():
                self.subnet = self._free_subnet()
                ip("link", "add", self.root_link, "type", "veth", "peer", "name", f"p{self.tag}R")
                ip("addr", "add", f"{self.outer(1)}/24", "dev", self.root_link)
                if self.ipv6:
                    ip("addr", "add", f"{self.outer6(1)}/64", "dev", self.root_link, "nodad")
                # The bastion's private network must not reach the default route from here: were a
                # regression to skip the jump and connect straight to it, its packets would leave the
                # machine. An unreachable route fails such a connection at once, on this host.
                ip("route", "add", "unreachable", self.inner_network)
            ip("link", "set", f"p{self.tag}R", "netns", self.switch)
            ip("-n", self.switch, "link", "set", f"p{self.tag}R", "master", "br0", "up")
            ip("link", "set", self.root_link, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def outer(self, last: int) -> str:
        """An address on the switch's network (the root namespace is .1)."""
        return f"198.18.{self.subnet}.{last}"

    def outer6(self, last: int) -> str:
        """An IPv6 address on the switch's network, with ``ipv6`` (the root namespace is ::1)."""
        return f"fd00:5050:{self.subnet:x}::{last:x}"

    @property
    def inner_network(self) -> str:
        return f"198.19.{self.subnet}.0/24"

    def inner(self, last: int) -> str:
        """An address on a bastion's private network (no route to it from the root namespace)."""
        return f"198.19.{self.subnet}.{last}"

    def add_host(self, name: str) -> NetHost:
        """A host on the switch, with its sshd running and answering."""
        number = len(self.hosts) + 1
        netns = self._namespace(f"{self.prefix}-{name}")
        port = f"p{self.tag}s{number}"
        address = self.outer6(10 + number) if self.ipv6 else self.outer(10 + number)
        self._link(netns, "eth0", address, self.switch, port)
        ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        return self._serve(NetHost(name, netns, address, port))

    def add_host_behind(self, name: str, bastion: NetHost) -> NetHost:
        """A host linked to ``bastion`` alone: reachable from here only through it (a new namespace
        forwards nothing, and the root namespace has no route to the bastion's private network)."""
        number = len(self.hosts) + 1
        netns = self._namespace(f"{self.prefix}-{name}")
        self._link(netns, "eth0", self.inner(10 + number), bastion.netns, f"eth{number}", self.inner(1))
        return self._serve(NetHost(name, netns, self.inner(10 + number), None))

    def _namespace(self, name: str) -> str:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def _link(self, netns: str, name: str, address: str, other_netns: str, other_name: str,
              other_address: str | None = None) -> None:
        """A veth pair: ``name`` with ``address`` (IPv4 or IPv6) in ``netns``, ``other_name`` in ``other_netns``."""
        here, there = f"p{self.tag}a", f"p{self.tag}b"
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", here, "netns", netns)
        ip("link", "set", there, "netns", other_netns)
        ip("-n", netns, "link", "set", here, "name", name)
        ip("-n", other_netns, "link", "set", there, "name", other_name)
        if ":" in address:
            ip("-n", netns, "addr", "add", f"{address}/64", "dev", name, "nodad")
        else:
            ip("-n", netns, "addr", "add", f"{address}/24", "dev", name)
        ip("-n", netns, "link", "set", name, "up")
        if other_address:
            ip("-n", other_netns, "addr", "add", f"{other_address}/24", "dev", other_name)
        ip("-n", other_netns, "link", "set", other_name, "up")

    def _serve(self, host: NetHost) -> NetHost:
        self.hosts[host.name] = host
        host.sshd = SshServer(self.state_dir / host.name, [host.address], netns=host.netns, port=22).start()
        return host

    @contextlib.contextmanager
    def _subnet_lock(self) -> Iterator[None]:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _free_subnet(self) -> int:
        """A /24 of 198.18.0.0/16 no interface or route here uses (other runs hold theirs under the lock)."""
        used = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")
        start = os.getpid() % 250
        for offset in range(250):
            candidate = (start + offset) % 250 + 1
            if f"198.18.{candidate}." not in used:
                return candidate
        raise RuntimeError("no free 198.18.x.0/24 for the test network")

    # -- cutting ---------------------------------------------------------------------------
    def cut(self, host: NetHost) -> None:
        """Pull the host's cable: its switch port goes down, nothing more reaches it or leaves it."""
        assert host.port is not None
        ip("-n", self.switch, "link", "set", host.port, "down")

    def mend(self, host: NetHost) -> None:
        assert host.port is not None
        ip("-n", self.switch, "link", "set", host.port, "up")

    # -- removing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every sshd, then remove the namespaces (their links go with them) and our root link."""
        errors = []
        for host in self.hosts.values():
            if host.sshd is not None:
                try:
                    host.sshd.stop()
                except Exception as exc:  # noqa: BLE001 - remove the rest anyway, then report
                    errors.append(exc)
        for name in reversed(self.namespaces):
            subprocess.run([IP, "netns", "delete", name], capture_output=True, timeout=TIMEOUT)
        self.namespaces.clear()
        if self.subnet >= 0:
            subprocess.run([IP, "route", "delete", "unreachable", self.inner_network], capture_output=True,
                           timeout=TIMEOUT)
        if Path(f"/sys/class/net/{self.root_link}").exists():
            subprocess.run([IP, "link", "delete", self.root_link], capture_output=True, timeout=TIMEOUT)
        if errors:
            raise errors[0]


def write_ssh_home(network: Network, root: Path, config_extra: Callable[[NetHost], str] = lambda host: "",
                   also_named: Callable[[NetHost], str] = lambda host: "") -> Path:
    """A HOME under ``root`` whose ~/.ssh/config names every host of ``network`` (and, per host, ``also_named``
    too), with its key and known_hosts, as users set them up; ``config_extra`` adds lines to a host's block."""
    ssh = root / "home" / ".ssh"
    ssh.mkdir(parents=True)
    blocks, known = [], []
    for host in network.hosts.values():
        assert host.sshd is not None
        shutil.copy(host.sshd.client_key, ssh / f"id_{host.name}")
        known.append(host.sshd.known_hosts.read_text())
        names = " ".join(name for name in (host.name, also_named(host)) if name)
        blocks.append(f"Host {names}\n  HostName {host.address}\n  User {host.sshd.user}\n"
                      f"  IdentityFile {ssh}/id_{host.name}\n  IdentitiesOnly yes\n  SendEnv {MARKER}\n"
                      f"  UserKnownHostsFile {ssh}/known_hosts\n  BatchMode yes\n"  # absolute: ssh(1) reads it too
                      + config_extra(host))
    (ssh / "config").write_text("".join(blocks))
    (ssh / "known_hosts").write_text("".join(known))
    return ssh.parent


def assert_nothing_left_on(network: Network) -> None:
    """No agent or instance on any host of ``network`` (bounded wait, then kill and fail); sshd's own session
    processes may take longer to notice a cut link, and are not ours to wait for."""
    ours = [p for host in network.hosts.values() if host.sshd is not None for p in host.sshd.session_processes()
            if not _is_sshd(p)]
    left = wait_gone(ours, timeout=15)
    for proc in left:
        proc.kill()
    assert not left, f"left running on the hosts: {[(p.pid, p.cmdline()) for p in left]}"


def _is_sshd(proc: psutil.Process) -> bool:
    try:
        return proc.name() == "sshd"
    except psutil.NoSuchProcess:
        return True  # gone already: nothing to wait for
