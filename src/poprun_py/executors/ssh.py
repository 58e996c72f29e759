"""Reaching remote hosts with Paramiko: one connection per host, checked stage by stage.

Every host is checked in parallel before anything is launched, each bounded
by one deadline (``--ssh-timeout``). A host that fails gets a verdict naming
the stage (name resolution, connect, SSH handshake, host key,
authentication, remote Python, poprun_py, version, working directory) and
what to do about it. A host that passes keeps its connection and its agent,
already started and greeted, for the launch itself.

``~/.ssh/config`` is honoured (HostName, Port, User, IdentityFile,
IdentitiesOnly, UserKnownHostsFile, ConnectTimeout); keys come from files
and the SSH agent; there is never a password prompt (Paramiko has none, and
no password is ever offered).
"""

from __future__ import annotations

import getpass
import logging
import os
import shlex
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import paramiko

from ..hosts import HostSpec
from .channels import SshChannel
from .greeting import HostCheckFailed, agent_script, greet, verdict_error

log = logging.getLogger("poprun.ssh")
logging.getLogger("paramiko").addHandler(logging.NullHandler())  # its thread's tracebacks are not for users

#: Our receive window: big, so fast remote output is not throttled by round trips.
WINDOW_BYTES = 16 * 1024 * 1024
#: A host that stops acknowledging for this long is gone (TCP_USER_TIMEOUT, with keepalives below).
DEAD_HOST_SECONDS = 30
KEEPALIVE_SECONDS = 5


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host, after ``~/.ssh/config``."""

    label: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts_files: tuple[str, ...]
    accept_unknown_host_keys: bool


def load_ssh_config(path: str = "~/.ssh/config") -> paramiko.SSHConfig:
    full = os.path.expanduser(path)
    return paramiko.SSHConfig.from_path(full) if os.path.isfile(full) else paramiko.SSHConfig()


def ssh_target(host: HostSpec, config: paramiko.SSHConfig) -> SshTarget:
    """The host as ssh would reach it: ``user@`` and ``:port`` on the command line win over the config."""
    found: Mapping[str, Any] = config.lookup(host.name)
    known = tuple(os.path.expanduser(p) for p in found.get("userknownhostsfile", "~/.ssh/known_hosts").split())
    return SshTarget(
        label=str(host),
        hostname=found.get("hostname", host.name),
        port=host.port or int(found.get("port", 22)),
        user=host.user or found.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in found.get("identityfile", [])),
        identities_only=found.get("identitiesonly", "no").lower() == "yes",
        known_hosts_files=known + ("/etc/ssh/ssh_known_hosts",),
        accept_unknown_host_keys=found.get("stricthostkeychecking", "yes").lower() in ("no", "off", "accept-new"),
    )


class _RejectUnknownHost(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostCheckFailed("host key", f"host key not known ({key.get_name()} for {hostname})")


@dataclass(eq=False)
class RemoteHost:
    """A checked host: its connection, its agent (started, greeted) and the addresses it was reached by."""

    target: SshTarget
    client: paramiko.SSHClient
    channel: SshChannel
    hello: Mapping[str, Any]
    address: str  # the host's address, as the launcher reached it
    local_address: str  # the launcher's address, as the host sees it

    def close(self) -> None:
        self.channel.close()
        self.client.close()


def connect_host(target: SshTarget, *, python: str, cwd: str, timeout: float) -> RemoteHost:
    """Connect, authenticate, start and greet the agent; ``HostCheckFailed`` names the stage that failed."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    try:
        infos = socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HostCheckFailed("name resolution", f"cannot resolve {target.hostname!r}: {exc.strerror}") from None
    sock = _connect(target, infos, left())
    client = paramiko.SSHClient()
    try:
        for path in target.known_hosts_files:
            if os.path.isfile(path):
                client.load_system_host_keys(path)
        client.set_missing_host_key_policy(
            paramiko.WarningPolicy() if target.accept_unknown_host_keys else _RejectUnknownHost())
        _handshake(client, target, sock, left())
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(KEEPALIVE_SECONDS)
        channel = transport.open_session(window_size=WINDOW_BYTES, timeout=left())
        channel.exec_command("exec sh -c " + shlex.quote(agent_script(python, cwd)))
        agent = SshChannel(channel, target.label)
        hello = greet(agent, python, cwd, deadline)
        return RemoteHost(target, client, agent, hello, sock.getpeername()[0], sock.getsockname()[0])
    except HostCheckFailed:
        client.close()
        sock.close()
        raise
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        sock.close()
        raise HostCheckFailed("ssh", f"the SSH session failed: {exc or type(exc).__name__}") from None


def _connect(target: SshTarget, infos: Sequence[Any], timeout: float) -> socket.socket:
    errors = []
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_HOST_SECONDS * 1000)
        return sock
    error = errors[-1]
    if isinstance(error, TimeoutError):
        why = f"no answer within {timeout:.3g}s"
    else:
        why = error.strerror or str(error)
    raise HostCheckFailed("connect", f"cannot connect to {target.hostname} port {target.port}: {why}")


def _handshake(client: paramiko.SSHClient, target: SshTarget, sock: socket.socket, timeout: float) -> None:
    key_files = tuple(p for p in target.identity_files if os.path.isfile(p))
    try:
        client.connect(
            target.hostname, port=target.port, username=target.user, sock=sock,
            key_filename=list(key_files) or None,
            look_for_keys=not target.identity_files, allow_agent=not target.identities_only,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
        )
    except paramiko.BadHostKeyException:
        raise HostCheckFailed("host key changed", "it differs from the one in known_hosts; if the host "
                              f"was reinstalled, remove the old key with ssh-keygen -R {_key_name(target)}") from None
    except paramiko.PasswordRequiredException as exc:
        raise HostCheckFailed("authentication", f"the key needs a passphrase ({exc}); add it to ssh-agent") from None
    except paramiko.AuthenticationException:
        raise HostCheckFailed("authentication", f"authentication refused for user {target.user!r}") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostCheckFailed("ssh handshake", f"no SSH server answered properly on port {target.port} "
                              f"({exc or type(exc).__name__})") from None


def _key_name(target: SshTarget) -> str:
    return target.hostname if target.port == 22 else f"'[{target.hostname}]:{target.port}'"


def host_key_advice(target: SshTarget) -> str:
    port = "" if target.port == 22 else f"-p {target.port} "
    return (f"add it with: ssh-keyscan -H {port}{target.hostname} >> ~/.ssh/known_hosts "
            "(after checking it), or log in once with ssh")


def check_hosts(hosts: Sequence[HostSpec], *, python: str, cwd: str, timeout: float) -> dict[str, RemoteHost]:
    """Every host checked at once; all pass (their connections returned) or ``PreflightFailed`` lists each verdict."""
    config = load_ssh_config()
    targets = [ssh_target(h, config) for h in hosts]
    with ThreadPoolExecutor(max_workers=min(64, len(targets)), thread_name_prefix="poprun-preflight") as pool:
        futures = [pool.submit(connect_host, t, python=python, cwd=cwd, timeout=timeout) for t in targets]
        results: list[RemoteHost | HostCheckFailed] = []
        for future in futures:  # each is bounded by its own deadline (every Paramiko wait has a timeout)
            try:
                results.append(future.result())
            except HostCheckFailed as exc:
                results.append(exc)
    failed = [(t, r) for t, r in zip(targets, results) if isinstance(r, HostCheckFailed)]
    if not failed:
        return {t.label: r for t, r in zip(targets, results) if isinstance(r, RemoteHost)}
    for result in results:
        if isinstance(result, RemoteHost):
            result.close()
    advice = {t.label: f"; {host_key_advice(t)}" for t, e in failed if e.stage == "host key"}
    raise verdict_error("remote hosts failed the pre-flight checks", [(t.label, e) for t, e in failed], len(targets), advice)
