"""A real, private OpenSSH server for the tests: each loopback address is a separate "host".

Why: the SSH executor must be tested against the real server's behaviour (auth refusal, host-key
checks, EOF on channel close, many parallel connections), not against a mock.  Linux routes all of
127.0.0.0/8 to ``lo``, so one sshd listening on 127.0.0.2, 127.0.0.3, ... gives distinct host names
(and distinct known_hosts entries) on one machine, all sharing one port.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

import psutil

SSHD = "/usr/sbin/sshd"  # absolute: sshd re-executes itself for every connection
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
IP = shutil.which("ip") or "/usr/sbin/ip"
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it when run as root
DEFAULT_ADDRESSES = ("127.0.0.2", "127.0.0.3")
MARKER = "POPRUN_TEST_MARKER"  # tests/conftest.py's leak check; the daemon must never carry it
START_TIMEOUT = 10.0


def unavailable_reason(addresses: Iterable[str] = DEFAULT_ADDRESSES) -> str | None:
    """Why a private sshd cannot run here (None when it can): for ``pytest.skip``."""
    for tool in (SSHD, SSH_KEYGEN):
        if not os.access(tool, os.X_OK):
            return f"{tool} not found (apt-get install openssh-server)"
    if not PRIVSEP_DIR.is_dir() and os.geteuid() == 0:
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
        except OSError as exc:
            return f"cannot create {PRIVSEP_DIR}: {exc}"
    for address in addresses:
        try:
            with socket.socket() as sock:
                sock.bind((address, 0))
        except OSError as exc:
            return f"cannot bind {address}: {exc}"
    return None


def keygen(path: Path, comment: str) -> Path:
    """A fresh passphrase-less ed25519 key pair (``path`` and ``path.pub``)."""
    for old in (path, path.with_suffix(".pub")):  # else ssh-keygen asks whether to overwrite
        old.unlink(missing_ok=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return path


def free_port(addresses: Iterable[str]) -> int:
    """A port free on every address (the kernel picks it on the first; the rest are checked)."""
    first, *rest = addresses
    while True:
        with socket.socket() as sock:
            sock.bind((first, 0))
            port = sock.getsockname()[1]
            try:
                for address in rest:
                    with socket.socket() as other:
                        other.bind((address, port))
            except OSError:
                continue
            return port


def ssh_banner(address: str, port: int, timeout: float = 1.0) -> bytes:
    """The server's identification line, proving an SSH server (not just a socket) answers."""
    with socket.create_connection((address, port), timeout=timeout) as sock:
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(256)
            if not chunk:
                break
            data += chunk
        return data.split(b"\n", 1)[0].strip()


class SshServer:
    """sshd on ``addresses`` x one port, keys, known_hosts and ssh_config all private to ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike, addresses: Iterable[str] = DEFAULT_ADDRESSES,
                 netns: str | None = None, port: int = 0) -> None:
        """With ``netns``, sshd runs in that network namespace (tests/infra/netns.py), on ``port`` (22 there)."""
        self.state_dir = Path(state_dir)
        self.addresses = tuple(addresses)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.netns = netns
        self._fixed_port = port
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        d = self.state_dir
        self.config, self.log = d / "sshd_config", d / "sshd.log"
        self.host_key, self.authorized_keys = d / "ssh_host_ed25519_key", d / "authorized_keys"
        self.client_key, self.other_key = d / "id_client", d / "id_other"
        self.known_hosts, self.ssh_config = d / "known_hosts", d / "ssh_config"

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> SshServer:
        """Generate keys and configs, start sshd and wait until every address returns a banner."""
        reason = unavailable_reason(() if self.netns else self.addresses)  # a namespace's addresses are its own
        if reason:
            raise RuntimeError(reason)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for key, comment in ((self.host_key, "host"), (self.client_key, "client"), (self.other_key, "other")):
            keygen(key, f"poprun-test-{comment}")
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        for _ in range(attempts):  # the port may be taken between free_port() and sshd's bind
            self.port = self._fixed_port or free_port(self.addresses)
            self._write_configs()
            if self._launch():
                return self
            self.stop()
        raise RuntimeError(f"sshd did not start:\n{self.log_text()}")

    def _write_configs(self) -> None:
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        lines = [f"ListenAddress {f'[{address}]' if ':' in address else address}:{self.port}"  # IPv6: [a]:port
                 for address in self.addresses] + [
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.state_dir / 'sshd.pid'}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",  # pytest's tmp dirs need not pass sshd's ownership checks
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
            "MaxSessions 64",
            "MaxStartups 100:30:200",  # the tests open many connections at once
            # sshd's own default (none) in a namespace, where links are cut: there only the agent's own
            # bound can stop a cut-off host's instances, and the tests show it does.
            f"ClientAliveInterval {0 if self.netns else 15}",
            "ClientAliveCountMax 2",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            f"AcceptEnv {MARKER}",  # lets a client opt remote processes into the leak check
            # SHLVL=1 makes bash skip ~/.bashrc (it only sources it when run by sshd at level 1):
            # remote commands start fast and see a known PATH, the venv's Python first.
            f"SetEnv PATH={path} SHLVL=1",
        ]
        self.config.write_text("\n".join(lines) + "\n")
        self.write_known_hosts(self.known_hosts, self.addresses)
        blocks = [f"Host {address}\n  HostName {address}\n  Port {self.port}\n  User {self.user}\n"
                  f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
                  f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                  "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 10\n"
                  f"  SendEnv {MARKER}\n"  # remote commands then join the test's leak check
                  for address in self.addresses]
        self.ssh_config.write_text("\n".join(blocks))

    def write_known_hosts(self, path: Path, addresses: Iterable[str]) -> Path:
        """Host-key lines for ``addresses``; a non-22 port is written ``[address]:port`` (OpenSSH's form)."""
        key_type, key_b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        names = [address if self.port == 22 else f"[{address}]:{self.port}" for address in addresses]
        path.write_text("".join(f"{name} {key_type} {key_b64}\n" for name in names))
        return path

    def known_hosts_without(self, address: str) -> Path:
        """An alternative known_hosts lacking ``address``'s entry (for "unknown host" tests)."""
        path = self.state_dir / f"known_hosts-without-{address}"
        return self.write_known_hosts(path, [a for a in self.addresses if a != address])

    def _launch(self) -> bool:
        """Start sshd; True once it listens on every address and answers with a banner there."""
        env = {k: v for k, v in os.environ.items() if k != MARKER}  # a fixture outlives any one test
        self.log.write_bytes(b"")
        inside = [IP, "netns", "exec", self.netns] if self.netns else []  # ip execs sshd: same pid
        self.process = subprocess.Popen(
            [*inside, SSHD, "-D", "-e", "-E", str(self.log), "-f", str(self.config)], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        pending = set(self.addresses)
        while time.monotonic() < deadline and self.process.poll() is None:
            text = self.log_text()
            if "Bind to port" in text:  # another process took the port on some address
                return False
            pending -= {a for a in pending if f"Server listening on {a} port {self.port}" in text}
            if not pending and self.netns:
                return True  # it listens; its address may be reachable only from inside (behind a bastion)
            if not pending:
                try:
                    if all(ssh_banner(a, self.port).startswith(b"SSH-2.0-") for a in self.addresses):
                        return True
                except OSError:
                    pass
            time.sleep(0.05)  # bounded polling for the daemon's readiness
        return False

    def log_text(self) -> str:
        """sshd's log (LogLevel VERBOSE): attach it to failure messages."""
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def session_processes(self) -> list[psutil.Process]:
        """sshd and everything it runs, including remote commands orphaned by a dropped connection."""
        procs: dict[int, psutil.Process] = {}
        if self.process is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(self.process.pid)
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        for proc in psutil.process_iter():  # orphans: sshd sets SSH_CONNECTION="cip cport sip sport"
            try:
                fields = proc.environ().get("SSH_CONNECTION", "").split()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if len(fields) == 4 and fields[2] in self.addresses and fields[3] == str(self.port):
                procs[proc.pid] = proc
        return [p for p in procs.values() if p.pid != os.getpid()]

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate sshd, its per-connection processes and the remote commands; verify none is left."""
        if self.process is None:
            return
        procs = self.session_processes()
        for signal_them in (psutil.Process.terminate, psutil.Process.kill):
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    signal_them(proc)
            if not (procs := wait_gone(procs, timeout)):
                break
        self.process.wait(timeout=timeout)  # reap our child
        self.process = None
        left = wait_gone(self.session_processes(), 0)
        if left:
            raise RuntimeError(f"sshd processes survived stop(): {[p.pid for p in left]}")


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout``; zombies count as gone (orphans are
    reaped by PID 1 when it gets round to it, psutil.wait_procs would wait for that)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        procs = alive
        time.sleep(0.01)


def write_config(ssh: Path, sshd: SshServer, aliases: dict[str, str], key: str = "id_ed25519") -> None:
    (ssh / "config").write_text("".join(
        f"Host {alias}\n  HostName {address}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile ~/.ssh/{key}\n  IdentitiesOnly yes\n"
        for alias, address in aliases.items()))
