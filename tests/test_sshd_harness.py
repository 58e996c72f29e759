"""The private sshd harness (tests/infra/sshd.py) behaves like a real multi-host SSH setup.

Also pins down what the SSH executor may rely on when a connection goes away: the remote command
gets EOF on stdin / EPIPE on stdout (no signal) without a pty, SIGHUP with one, and nothing at all
if it neither reads nor writes - it is orphaned and keeps running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import paramiko
import psutil
import pytest

from infra import netns
from infra.sshd import MARKER, SshServer, ssh_banner, unavailable_reason, wait_gone
from support import read_line

TIMEOUT = 10.0

# Remote program: prints its pid, then waits as ``mode`` says and reports how it ended to ``report``.
REMOTE = r"""
import os, signal, sys, time
mode, report = sys.argv[1], sys.argv[2]
def note(what):
    with open(report, "a") as f:
        f.write(what + "\n")
def on_signal(sig, frame):
    note(signal.Signals(sig).name)
    os._exit(128 + sig)
for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, on_signal)
print(os.getpid(), flush=True)
try:
    if mode == "stdin":
        sys.stdin.read()
        note("EOF")
    elif mode == "write":
        while True:
            print("tick", flush=True)
            time.sleep(0.05)
    else:
        while True:
            time.sleep(1000)
except BrokenPipeError:
    note("EPIPE")
"""

# Local SSH client, killed by the test: runs one remote command and relays its first line.
CLIENT = r"""
import sys, paramiko
host, port, user, key, known_hosts, command, pty, marker = sys.argv[1:]
client = paramiko.SSHClient()
client.load_host_keys(known_hosts)
client.set_missing_host_key_policy(paramiko.RejectPolicy())
client.connect(host, port=int(port), username=user, key_filename=key, timeout=10,
               look_for_keys=False, allow_agent=False)
stdin, stdout, _ = client.exec_command(command, get_pty=pty == "1", timeout=30,
                                       environment={"POPRUN_TEST_MARKER": marker})
sys.stdout.write(stdout.readline())
sys.stdout.flush()
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SshServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def connect(server: SshServer, address: str, key: Path | None = None,
            known_hosts: Path | None = None) -> paramiko.SSHClient:
    """A paramiko client configured the way ssh(1) would be, from the harness's ssh_config."""
    host = paramiko.SSHConfig.from_path(str(server.ssh_config)).lookup(address)
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or host["userknownhostsfile"]))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host["hostname"], port=int(host["port"]), username=host["user"],
                       key_filename=str(key) if key else host["identityfile"], timeout=TIMEOUT,
                       banner_timeout=TIMEOUT, auth_timeout=TIMEOUT, look_for_keys=False, allow_agent=False)
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[str, str, int]:
    _, stdout, stderr = client.exec_command(command, timeout=TIMEOUT)
    return stdout.read().decode(), stderr.read().decode(), stdout.channel.recv_exit_status()


def gone(proc: psutil.Process) -> bool:
    """Exited; a zombie counts (orphans wait for PID 1 to reap them, which may take a while)."""
    return not wait_gone([proc], 0)


def ssh(server: SshServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(server.ssh_config), *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def test_ssh_config_is_readable_by_paramiko(sshd: SshServer) -> None:
    host = paramiko.SSHConfig.from_path(str(sshd.ssh_config)).lookup("127.0.0.3")
    assert (host["hostname"], host["port"], host["user"]) == ("127.0.0.3", str(sshd.port), sshd.user)
    assert host["identityfile"] == [str(sshd.client_key)]
    assert host["userknownhostsfile"] == str(sshd.known_hosts)
    assert f"[127.0.0.3]:{sshd.port} ssh-ed25519 " in sshd.known_hosts.read_text()


@pytest.mark.parametrize("address", ["127.0.0.2", "127.0.0.3"])
def test_system_ssh_runs_a_command_on_each_address(sshd: SshServer, address: str) -> None:
    result = ssh(sshd, address, 'echo "$SSH_CONNECTION"; echo oops >&2; exit 3')
    assert result.returncode == 3, result.stderr
    assert result.stdout.split()[2:] == [address, str(sshd.port)]
    assert result.stderr == "oops\n"


def test_paramiko_runs_the_same_python(sshd: SshServer) -> None:
    with connect(sshd, "127.0.0.2") as client:
        out, err, status = run(client, f"{sys.executable} -c 'import sys; print(sys.executable)'; exit 5")
        assert (out.strip(), err, status) == (sys.executable, "", 5)
        out, _, _ = run(client, "command -v python")  # the venv comes first on the login PATH
        assert out.strip() == os.path.join(os.path.dirname(sys.executable), "python")


def test_unauthorised_key_is_refused(sshd: SshServer) -> None:
    with pytest.raises(paramiko.AuthenticationException):
        connect(sshd, "127.0.0.2", key=sshd.other_key)
    result = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(sshd.port), "-i", str(sshd.other_key),
                             "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                             "-o", f"UserKnownHostsFile={sshd.known_hosts}", f"{sshd.user}@127.0.0.2", "true"],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 255 and "Permission denied (publickey)" in result.stderr


def test_unknown_host_is_rejected(sshd: SshServer) -> None:
    partial = sshd.known_hosts_without("127.0.0.3")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(sshd, "127.0.0.3", known_hosts=partial)
    with connect(sshd, "127.0.0.2", known_hosts=partial) as client:
        assert run(client, "echo ok")[0] == "ok\n"
    result = ssh(sshd, "-o", f"UserKnownHostsFile={partial}", "127.0.0.3", "true")
    assert result.returncode == 255 and "Host key verification failed" in result.stderr


def test_many_parallel_connections(sshd: SshServer) -> None:
    def one(i: int) -> str:
        with connect(sshd, sshd.addresses[i % 2]) as client:
            return run(client, f"echo {i}")[0]

    with ThreadPoolExecutor(max_workers=24) as pool:
        assert list(pool.map(one, range(24))) == [f"{i}\n" for i in range(24)]


@pytest.mark.parametrize("how", ["close channel", "drop stdin"])
def test_remote_command_gets_eof(sshd: SshServer, tmp_path: Path, how: str) -> None:
    """Beware: paramiko's stdin file sends EOF (shutdown_write) when garbage-collected."""
    script, report = tmp_path / "remote.py", tmp_path / "report"
    script.write_text(REMOTE)
    with connect(sshd, "127.0.0.2") as client:
        stdin, stdout, _ = client.exec_command(f"{sys.executable} {script} stdin {report}", timeout=TIMEOUT)
        remote = psutil.Process(int(stdout.readline()))
        assert not gone(remote)
        if how == "close channel":
            stdout.channel.close()
        else:
            del stdin
        assert not wait_gone([remote], TIMEOUT)
        assert report.read_text() == "EOF\n"


@pytest.mark.parametrize("mode, pty, ending", [
    ("stdin", False, "EOF"),      # no signal: sshd just closes the pipes
    ("write", False, "EPIPE"),    # ... so a writer fails on its next write
    ("idle", False, None),        # and a command that does neither keeps running, orphaned
    ("idle", True, "SIGHUP"),     # with a pty, the kernel hangs up the session
])
def test_sigkilled_client(sshd: SshServer, tmp_path: Path, no_leaked_processes: str,
                          mode: str, pty: bool, ending: str | None) -> None:
    script, report = tmp_path / "remote.py", tmp_path / "report"
    script.write_text(REMOTE)
    command = f"{sys.executable} {script} {mode} {report}"
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, "127.0.0.2", str(sshd.port), sshd.user, str(sshd.client_key),
         str(sshd.known_hosts), command, "1" if pty else "0", no_leaked_processes],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        remote = psutil.Process(int(read_line(client.stdout, TIMEOUT)))
        assert remote.environ()[MARKER] == no_leaked_processes  # AcceptEnv: the leak check sees it
        session = remote.parent()
        assert session is not None and session.name() == "sshd"
    finally:
        client.kill()
        client.wait(TIMEOUT)
    if ending is not None:
        assert not wait_gone([remote], TIMEOUT), f"remote {mode} command survived its client"
        assert report.read_text() == f"{ending}\n"
        return
    assert not wait_gone([session], TIMEOUT), "sshd kept the dead connection"
    assert not gone(remote) and remote.ppid() != session.pid
    remote.kill()
    assert not wait_gone([remote], TIMEOUT)
    assert not report.exists()


def test_stop_leaves_nothing_behind(tmp_path: Path) -> None:
    if unavailable_reason(("127.0.0.4",)):
        pytest.skip(unavailable_reason(("127.0.0.4",)))
    server = SshServer(tmp_path, ["127.0.0.4"]).start()
    try:
        assert MARKER not in psutil.Process(server.process.pid).environ()  # type: ignore[union-attr]
        client = connect(server, "127.0.0.4")
        _, stdout, _ = client.exec_command(f"{sys.executable} -c 'import os, time; print(os.getpid(), "
                                           "flush=True); time.sleep(1000)'", timeout=TIMEOUT)
        remote = psutil.Process(int(stdout.readline()))
        assert len(server.session_processes()) >= 3  # listener, per-connection sshd(s), the command
    finally:
        server.stop()
    client.close()
    assert gone(remote) and not server.session_processes()


def test_network_namespaces_are_removed_even_when_a_test_fails(tmp_path: Path) -> None:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="a failing test"):
        with netns.Network(tmp_path) as net:
            host = net.add_host("solo")
            assert host.sshd is not None and host.sshd.process is not None
            sshd = psutil.Process(host.sshd.process.pid)
            assert ssh_banner(host.address, 22, timeout=TIMEOUT).startswith(b"SSH-2.0-")  # over the switch
            names = list(net.namespaces)
            raise RuntimeError("a failing test")
    listed = netns.ip("netns", "list")
    assert not [name for name in names if name in listed]
    assert not Path(f"/sys/class/net/{net.root_link}").exists()
    assert gone(sshd)

