"""Hosts behind a bastion: ``ProxyJump`` and ``ProxyCommand`` from ssh_config, as ssh(1) uses them.

A ProxyJump host is reached like any other host (its own ssh_config entry:
HostName, Port, User, keys, known_hosts, even its own ProxyJump), then asked
for a ``direct-tcpip`` channel to the target: the bastion resolves and
connects, so the target's name need mean nothing here. A ProxyCommand is run
by ``sh -c`` with ssh(1)'s tokens already expanded (Paramiko's SSHConfig does
that) and its stdin/stdout carry the connection.
"""

from __future__ import annotations

import subprocess
from typing import Any, Mapping

import paramiko

from ..hosts import HostListError, HostSpec, parse_host_list
from .greeting import HostCheckFailed

#: ProxyJump chains longer than this are a loop in ssh_config, not a network.
MAX_JUMPS = 8


def jump_hosts(found: Mapping[str, Any]) -> tuple[str, ...]:
    """ProxyJump's hosts as written, first hop first (``none`` or absent: none)."""
    value = str(found.get("proxyjump") or "").strip()
    if not value or value.lower() == "none":
        return ()
    return tuple(item.strip() for item in value.split(",") if item.strip())


def parse_jump(item: str) -> HostSpec:
    """One ProxyJump hop, ``[user@]host[:port]`` or an ``ssh://`` URI."""
    try:
        (host,) = parse_host_list(item.removeprefix("ssh://").rstrip("/"))
    except (HostListError, ValueError):
        raise HostCheckFailed("proxy", f"cannot read the ProxyJump host {item!r}; write it [user@]host[:port]") from None
    return host


def proxy_command(found: Mapping[str, Any]) -> str | None:
    command = found.get("proxycommand")
    return str(command) if command else None


class _ProxyCommand(paramiko.ProxyCommand):
    """Paramiko's, closed safely: signalled only while not yet reaped (so its pid is still its own), then reaped."""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def run_proxy_command(command: str) -> paramiko.ProxyCommand:
    try:
        return _ProxyCommand(command)
    except (OSError, paramiko.SSHException) as exc:
        raise HostCheckFailed("proxy", f"ProxyCommand {command!r} did not start: {exc}") from None


def tunnel(jump: paramiko.SSHClient, via: str, hostname: str, port: int, timeout: float) -> paramiko.Channel:
    """A channel from the jump host to ``hostname:port``, to carry the target's SSH connection."""
    transport = jump.get_transport()
    assert transport is not None
    try:
        return transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise HostCheckFailed("connect", f"the jump host {via} cannot connect to {hostname} port {port}: "
                              f"{exc or type(exc).__name__}") from None
