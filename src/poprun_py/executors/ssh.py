"""Reaching remote hosts with Paramiko: one connection per host, checked stage by stage.

Every host is checked in parallel before anything is launched, each bounded
by one deadline (``--ssh-timeout``). A host that fails gets a verdict naming
the stage (name resolution, connect, SSH handshake, host key,
authentication, remote Python, poprun_py, version, working directory) and
what to do about it. A host that passes keeps its connection and its agent,
already started and greeted, for the launch itself, and a keepalive thread
(``keepalive.py``) that names it lost if it stops answering.

``~/.ssh/config`` is honoured, then ``/etc/ssh/ssh_config`` for what it
leaves unset (``ssh_config.py``); keys come from files and the SSH agent;
there is never a password prompt (Paramiko has none, and no password is
ever offered).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import shlex
import signal
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import paramiko

from ..errors import InterruptedAndLogged
from ..hosts import HostSpec
from .channels import SshChannel
from .greeting import HostCheckFailed, agent_script, greet, verdict_error
from .keepalive import KeepAlive
from .proxy import MAX_JUMPS, parse_jump, run_proxy_command, tunnel
from .ssh_config import SshConfig, SshTarget, load_ssh_config, ssh_target

log = logging.getLogger("poprun.ssh")
logging.getLogger("paramiko").addHandler(logging.NullHandler())  # its thread's tracebacks are not for users

#: Our receive window: big, so fast remote output is not throttled by round trips.
WINDOW_BYTES = 16 * 1024 * 1024
#: Unacknowledged data older than this ends a direct connection (TCP_USER_TIMEOUT); keepalives decide sooner.
DEAD_HOST_SECONDS = 30
OPENSSH_KEY_MAGIC = b"openssh-key-v1\0"


@dataclass(eq=False)
class RemoteHost:
    """A checked host: its connection, its agent (started, greeted) and the addresses it was reached by."""

    target: SshTarget
    client: paramiko.SSHClient
    channel: SshChannel
    hello: Mapping[str, Any]
    address: str  # the host's address, as the launcher reached it
    local_address: str  # the launcher's address, as the host sees it
    keepalive: KeepAlive | None = None
    hops: tuple[paramiko.SSHClient, ...] = ()  # ProxyJump connections, first hop first

    def close(self) -> None:
        if self.keepalive is not None:
            self.keepalive.stop()
        self.channel.close()
        self.client.close()
        for hop in reversed(self.hops):
            hop.close()


def connect_host(target: SshTarget, *, python: str, cwd: str, timeout: float,
                 config: SshConfig | None = None) -> RemoteHost:
    """Connect, authenticate, start and greet the agent; ``HostCheckFailed`` names the stage that failed."""
    deadline = time.monotonic() + timeout
    client, sock, hops = _open_client(target, config or load_ssh_config(), deadline, 0)
    try:
        transport = client.get_transport()
        assert transport is not None
        channel = transport.open_session(window_size=WINDOW_BYTES, timeout=_left(deadline))
        channel.exec_command("exec sh -c " + shlex.quote(agent_script(python, cwd)))
        agent = SshChannel(channel, target.label)
        hello = greet(agent, python, cwd, deadline)
        address, local_address = _addresses(target, sock, hello, hops)
        keepalive = KeepAlive(transport, agent, target.label, target.alive).start()
        return RemoteHost(target, client, agent, hello, address, local_address, keepalive, hops)
    except BaseException as exc:
        _close(client, sock, hops)
        if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
            raise HostCheckFailed("ssh", f"the SSH session failed: {exc or type(exc).__name__}") from None
        raise


def _left(deadline: float) -> float:
    return max(0.05, deadline - time.monotonic())


def _close(client: paramiko.SSHClient | None, sock: Any, hops: Sequence[paramiko.SSHClient]) -> None:
    if client is not None:
        client.close()
    if sock is not None:
        sock.close()
    for hop in reversed(hops):
        hop.close()


def _open_client(target: SshTarget, config: SshConfig, deadline: float,
                 depth: int) -> tuple[paramiko.SSHClient, Any, tuple[paramiko.SSHClient, ...]]:
    """An authenticated client for ``target``: directly, through its ProxyJump hosts, or its ProxyCommand."""
    hops: tuple[paramiko.SSHClient, ...] = ()
    sock: Any = None
    client: paramiko.SSHClient | None = None
    try:
        if target.jumps:
            hops, sock = _through_jumps(target, config, deadline, depth)
        elif target.proxy_command:
            sock = run_proxy_command(target.proxy_command)
        else:
            try:
                infos = socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise HostCheckFailed("name resolution",
                                      f"cannot resolve {target.hostname!r}: {exc.strerror}") from None
            sock = _connect(target, infos, _left(deadline))
        client = paramiko.SSHClient()
        target.host_keys.load_into(client)
        client.set_missing_host_key_policy(target.host_keys.policy(target.label))
        _handshake(client, target, sock, _left(deadline))
        return client, sock, hops
    except BaseException:
        _close(client, sock, hops)
        raise


def _through_jumps(target: SshTarget, config: SshConfig, deadline: float,
                   depth: int) -> tuple[tuple[paramiko.SSHClient, ...], paramiko.Channel]:
    """ProxyJump a,b: reach b through a (b's own ProxyJump is overridden), then the target through b."""
    if depth >= MAX_JUMPS:
        raise HostCheckFailed("proxy", f"more than {MAX_JUMPS} ProxyJump hops: is there a loop in ~/.ssh/config?")
    *before, last = target.jumps
    hop_target = ssh_target(parse_jump(last), config)
    if before:
        hop_target = dataclasses.replace(hop_target, jumps=tuple(before), proxy_command=None)
    try:
        hop, _, earlier = _open_client(hop_target, config, deadline, depth + 1)
    except HostCheckFailed as exc:
        raise HostCheckFailed(f"jump host {last}: {exc.stage}", str(exc)) from None
    hops = (*earlier, hop)
    try:
        return hops, tunnel(hop, str(last), target.hostname, target.port, _left(deadline))
    except BaseException:
        _close(None, None, hops)
        raise


def _addresses(target: SshTarget, sock: Any, hello: Mapping[str, Any],
               hops: Sequence[paramiko.SSHClient]) -> tuple[str, str]:
    """The host's address and the launcher's address as the host sees it (for the fabric).

    Through a proxy the socket says nothing about the host: its own sshd does
    (SSH_CONNECTION, in the agent's hello). The launcher's side is then a
    guess: the address the first hop sees it at, else the one this machine
    would route to the host from (only SSH goes through a bastion, so
    instances there reach poprun directly or not at all).
    """
    if isinstance(sock, socket.socket):
        return sock.getpeername()[0], sock.getsockname()[0]
    fields = str(hello.get("ssh_connection") or "").split()
    address = fields[2] if len(fields) == 4 else target.hostname
    first = hops[0].get_transport() if hops else None
    if first is not None and isinstance(first.sock, socket.socket):
        return address, first.sock.getsockname()[0]
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # a route lookup: connecting a UDP socket sends nothing
            return address, probe.getsockname()[0]
    except OSError:
        return address, "127.0.0.1"


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
    raise HostCheckFailed("connect", f"cannot connect to {target.hostname} port {target.port}: {why}"
                          + _slot_count_hint(target.port))


def _slot_count_hint(port: int) -> str:
    """mpirun's ``-H nodeA:2`` means two slots; here ``:2`` is the SSH port (as in ``ssh -p``)."""
    if port >= 1024 or port == 22:
        return ""
    return (f" (if :{port} was meant as mpirun's slot count: poprun-py reads host:N as the SSH port; "
            f"slots come from a --host-file's 'host slots={port}')")


def public_key_blob(identity_file: str) -> bytes | None:
    """The public half of an IdentityFile without its passphrase, as ssh finds it: the ``.pub`` beside it,
    else the unencrypted header of an OpenSSH-format private key (PEM keys keep it encrypted)."""
    try:
        with open(identity_file + ".pub") as pub:
            return base64.b64decode(pub.read().split()[1])
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(identity_file) as private:
            armoured = private.read()
        body = "".join(armoured.split("-----BEGIN OPENSSH PRIVATE KEY-----", 1)[1].split("-----END")[0].split())
        data = base64.b64decode(body)
    except (OSError, IndexError, ValueError):
        return None
    if not data.startswith(OPENSSH_KEY_MAGIC):
        return None
    message = paramiko.Message(data[len(OPENSSH_KEY_MAGIC):])
    for _ in range(3):  # cipher name, KDF name, KDF options
        message.get_string()
    return message.get_binary() if message.get_int() >= 1 else None


def _agent_keys(target: SshTarget, key_files: tuple[str, ...]) -> tuple[paramiko.Agent | None, dict[str, Any]]:
    """With IdentitiesOnly, ssh still offers agent keys, but only those of the IdentityFiles: by file."""
    if not (target.identities_only and key_files and os.environ.get("SSH_AUTH_SOCK")):
        return None, {}
    agent = paramiko.Agent()
    try:
        loaded = {key.asbytes(): key for key in agent.get_keys()}
    except paramiko.SSHException as exc:  # an agent that answers nonsense: the files alone, as without one
        log.debug("ignoring ssh-agent: %s", exc)
        loaded = {}
    found = {path: loaded[blob] for path in key_files if (blob := public_key_blob(path)) in loaded}
    if not found:
        agent.close()
        return None, {}
    return agent, found


def _handshake(client: paramiko.SSHClient, target: SshTarget, sock: Any, timeout: float) -> None:
    key_files = tuple(p for p in target.identity_files if os.path.isfile(p))
    agent, from_agent = _agent_keys(target, key_files)
    first = next(iter(from_agent), None)  # Paramiko takes one key object: the first file the agent holds
    try:
        client.connect(
            target.hostname, port=target.port, username=target.user, sock=sock,
            pkey=from_agent.get(first or ""), key_filename=[p for p in key_files if p != first] or None,
            look_for_keys=not target.identity_files, allow_agent=not target.identities_only,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
        )
    except paramiko.BadHostKeyException as exc:
        raise HostCheckFailed("host key changed", f"the {exc.key.get_name()} key of {_key_name(target)} differs "
                              "from the one in known_hosts (someone may be intercepting the connection); if the "
                              f"host was reinstalled, remove the old key with "
                              f"{target.host_keys.removal_advice(_key_name(target))}") from None
    except paramiko.PasswordRequiredException as exc:
        raise HostCheckFailed("authentication", f"the key needs a passphrase ({exc}); add it to ssh-agent") from None
    except paramiko.AuthenticationException:
        raise HostCheckFailed("authentication", f"authentication refused for user {target.user!r}") from None
    except paramiko.SSHException as exc:
        if "No authentication methods available" not in str(exc):  # (Paramiko's words when it had no key to try)
            raise HostCheckFailed("ssh handshake", f"no SSH server answered properly on port {target.port} "
                                  f"({exc or type(exc).__name__})") from None
        raise HostCheckFailed("authentication", _no_key(target, key_files)) from None
    except (EOFError, OSError) as exc:
        raise HostCheckFailed("ssh handshake", f"no SSH server answered properly on port {target.port} "
                              f"({exc or type(exc).__name__})") from None
    finally:
        if agent is not None:
            agent.close()


def _no_key(target: SshTarget, key_files: tuple[str, ...]) -> str:
    """Why there was no key to offer: ssh says "no such identity" and "Permission denied (publickey)"."""
    missing = [p for p in target.identity_files if p not in key_files]
    if missing:
        why = "IdentityFile " + ", ".join(missing) + (" does not exist" if len(missing) == 1 else " do not exist")
    else:
        why = "no key in ~/.ssh (id_rsa, id_ecdsa, id_ed25519, id_dsa)"
    agent = (" and ssh-agent holds no key of the IdentityFiles (IdentitiesOnly)" if target.identities_only
             else " and no ssh-agent key")
    return (f"no key to offer for user {target.user!r}: {why}{agent}; fix IdentityFile in ~/.ssh/config, "
            "or add a key with ssh-add")


def _key_name(target: SshTarget) -> str:
    """The name known_hosts files use for the target (Paramiko looks it up so)."""
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def host_key_advice(target: SshTarget) -> str:
    port = "" if target.port == 22 else f"-p {target.port} "
    return (f"add it with: ssh-keyscan -H {port}{target.hostname} >> ~/.ssh/known_hosts "
            "(after checking it), or log in once with ssh")


def _verdict(future: Future[RemoteHost]) -> RemoteHost | HostCheckFailed:
    try:
        return future.result()  # bounded by the host's own deadline (every Paramiko wait has a timeout)
    except HostCheckFailed as exc:
        return exc


def _abandon(pool: ThreadPoolExecutor, futures: Sequence[Future[RemoteHost]]) -> None:
    """Ctrl-C: not waiting for the checks under way (a connect to a cut link takes its whole timeout); each
    host that passes after all is closed as soon as it does, so its agent stops (``exit_now`` ends the rest)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for future in futures:
        future.add_done_callback(_close_if_passed)


def _close_if_passed(future: Future[RemoteHost]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _leave_ctrl_c_to_the_main_thread() -> None:
    """In a check's thread (and Paramiko's, which inherit its mask): SIGINT blocked, so that the kernel delivers a
    Ctrl-C to the main thread, whose wait for the verdicts it interrupts (delivered to a thread blocked in a
    connect, it only set Python's flag, and the main thread slept on until every check had ended)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def check_hosts(hosts: Sequence[HostSpec], *, python: str, cwd: str, timeout: float) -> dict[str, RemoteHost]:
    """Every host checked at once; all pass (their connections returned) or ``PreflightFailed`` lists each verdict."""
    config = load_ssh_config()
    targets = [ssh_target(h, config) for h in hosts]
    pool = ThreadPoolExecutor(max_workers=min(64, len(targets)), thread_name_prefix="poprun-preflight",
                              initializer=_leave_ctrl_c_to_the_main_thread)
    futures: list[Future[RemoteHost]] = []
    try:
        for target in targets:
            futures.append(pool.submit(connect_host, target, python=python, cwd=cwd, timeout=timeout, config=config))
        results = [_verdict(future) for future in futures]
    except KeyboardInterrupt:
        _abandon(pool, futures)
        log.warning("received SIGINT during the pre-flight checks of %s: stopped checking (nothing was started)",
                    ", ".join(t.label for t in targets))
        raise InterruptedAndLogged() from None
    pool.shutdown()
    failed = [(t, r) for t, r in zip(targets, results) if isinstance(r, HostCheckFailed)]
    if not failed:
        return {t.label: r for t, r in zip(targets, results) if isinstance(r, RemoteHost)}
    for result in results:
        if isinstance(result, RemoteHost):
            result.close()
    advice = {t.label: f"; {host_key_advice(t)}" for t, e in failed if e.stage == "host key"}
    raise verdict_error("remote hosts failed the pre-flight checks", [(t.label, e) for t, e in failed], len(targets), advice)
