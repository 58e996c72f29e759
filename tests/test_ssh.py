"""Multi-host launches over SSH, against a real OpenSSH server on 127.0.0.2 and 127.0.0.3.

Each loopback address is a "host": poprun connects with Paramiko, checks it,
starts an agent there and runs that host's instances through it. Users reach
the hosts by aliases in ``~/.ssh/config`` (HOME is a private directory per
test), which proves HostName, Port, User, IdentityFile and known_hosts are
honoured. After every test no agent or instance may be left on any "host".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import paramiko
import psutil
import pytest

from infra.sshd import MARKER, SshServer, write_config
from poprun_py.errors import EXIT_PREFLIGHT, EXIT_USAGE
from poprun_py.ranges import format_cpus
from support import PROGRAMS, Launch, assert_all_gone, pids_of, python_program, run_poprun

OFFLINE = "--offline-mode=1"
FORWARD_MARKER = f"-x {MARKER}"  # remote instances join the test's leak check
HOSTS = "nodeA,nodeB"  # (the fixtures sshd and home: tests/conftest.py)


def launch_args(*args: str) -> tuple[str, ...]:
    return ("-H", HOSTS, OFFLINE, "--mpi-global-args", FORWARD_MARKER, *args)


def instance_lines(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith(b"{")]


# -- launching ---------------------------------------------------------------------------
def test_instances_run_on_their_hosts_with_the_contract(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/forwarded-by-poprun")
    result = run_poprun(*launch_args("--num-instances", "4", "--num-replicas", "8",
                                     "--mpi-local-args=-x SEED=7", *python_program("print_env.py")))
    assert result.returncode == 0, result.stderr
    seen = sorted(instance_lines(result.stdout), key=lambda d: d["api"]["instance"])
    assert [d["api"]["instance"] for d in seen] == [0, 1, 2, 3]
    for d in seen:
        env, index = d["env"], d["api"]["instance"]
        assert env["POPRUN_HOST"] == ("nodeA" if index < 2 else "nodeB")
        assert env["SSH_CONNECTION"].split()[2] == ("127.0.0.2" if index < 2 else "127.0.0.3")
        assert d["api"]["local_instance"] == index % 2 and d["api"]["offset"] == 2 * index
        assert env["POPRUN_FABRIC_ADDR"] == ("127.0.0.2" if index < 2 else "127.0.0.3")
        assert env["SEED"] == "7" and env["PYTHONPATH"] == "/opt/forwarded-by-poprun"
        assert env["MASTER_ADDR"] == "127.0.0.2"
        assert "POPRUN_JOB_TOKEN" in env
    assert os.environ.get("SEED") is None  # -x travelled in the start frame, not from our environment


def test_local_and_remote_hosts_together(home: Path) -> None:
    result = run_poprun("-H", "localhost,nodeB", OFFLINE, "--mpi-global-args", f"--tag-output {FORWARD_MARKER}",
                        "--num-instances", "2", "--num-replicas", "2", *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    by_tag = {line.split(b"<stdout>:")[0]: json.loads(line.split(b"<stdout>:", 1)[1]) for line in lines}
    assert "SSH_CONNECTION" not in by_tag[b"[1,0]"]["env"] and "SSH_CONNECTION" in by_tag[b"[1,1]"]["env"]
    assert by_tag[b"[1,0]"]["env"]["POPRUN_FABRIC_ADDR"] == "127.0.0.1"


def test_collectives_across_hosts(home: Path) -> None:
    result = run_poprun(*launch_args("--num-instances", "4", "--num-replicas", "4",
                                     *python_program("collectives_check.py")))
    assert result.returncode == 0, result.stderr[-3000:]  # every result was checked against NumPy
    assert len(instance_lines(result.stdout)) == 4


def test_output_from_remote_hosts_is_lossless(home: Path) -> None:
    n = 100_000
    result = run_poprun(*launch_args("--num-instances", "2", "--num-replicas", "2",
                                     *python_program("emit.py", "lines", str(n))))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * n
    for index in (0, 1):
        assert [line for line in lines if line.startswith(b"%d " % index)] == [b"%d %d" % (index, i) for i in range(n)]


def test_a_ten_megabyte_line_from_a_remote_host(home: Path) -> None:
    size = 10 * 1024 * 1024
    result = run_poprun("-H", "nodeA", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        *python_program("emit.py", "bigline", str(size)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"x" * size


def test_a_program_missing_on_the_remote_host_is_127(home: Path) -> None:
    result = run_poprun(*launch_args("--num-instances", "2", "--num-replicas", "2", "no-such-program-anywhere"))
    assert result.returncode == 127 and b"nodeA" in result.stderr and b"no-such-program-anywhere" in result.stderr


# -- failures across hosts ------------------------------------------------------------------
def test_a_remote_failure_stops_every_host(home: Path) -> None:
    launch = Launch(*launch_args("--num-instances", "4", "--num-replicas", "4", "--stop-grace", "2",
                                 *python_program("behave.py", "--ready", "--fail", "3", "exit3", "--others", "sleep")))
    assert launch.finish() == 3
    stderr = launch.stderr.decode()
    assert "instance 3 of 4" in stderr and "nodeB" in stderr and "exited with code 3" in stderr
    assert "stopped by poprun as a consequence: 0-2" in stderr


def test_a_lost_host_fails_its_instances_and_stops_the_rest(home: Path, sshd: SshServer) -> None:
    launch = Launch(*launch_args("--num-instances", "2", "--num-replicas", "2",
                                 *python_program("behave.py", "--ready", "--others", "sleep")))
    launch.wait_for_lines(b"ready", 2)
    agents = [p for p in sshd.session_processes() if "poprun_py.executors.agent" in " ".join(p.cmdline())
              and p.environ().get("SSH_CONNECTION", "").split()[2:3] == ["127.0.0.3"]]
    assert len(agents) == 1
    agents[0].kill()
    assert launch.finish() != 0
    stderr = launch.stderr.decode()
    assert "lost nodeB" in stderr and "instance 1 of 2" in stderr


def test_ctrl_c_stops_every_host(home: Path) -> None:
    launch = Launch(*launch_args("--num-instances", "2", "--num-replicas", "2",
                                 *python_program("behave.py", "--ready", "--others", "sleep")))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    launch.process.send_signal(signal.SIGINT)
    assert launch.finish() == 130
    assert_all_gone(pids)


def test_sigkill_of_poprun_leaves_nothing_on_any_host(home: Path) -> None:
    launch = Launch(*launch_args("--num-instances", "4", "--num-replicas", "4",
                                 *python_program("behave.py", "--ready", "--child", "--others", "sleep")))
    pids = pids_of(launch.wait_for_lines(b"ready", 4))
    launch.process.kill()
    launch.finish()
    assert_all_gone(pids)  # the grandchildren and agents: the leak checks after the test


def test_a_daemon_a_remote_instance_starts_dies_with_the_job(home: Path) -> None:
    """Each agent adopts what its instances daemonise (fork, setsid, fork, empty environment) and kills it."""
    result = run_poprun(*launch_args("--num-instances", "2", "--num-replicas", "2",
                                     *python_program("daemonize.py", "--clean-env")))
    daemons = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith(b"daemon ")]
    try:
        assert result.returncode == 0 and len(daemons) == 2, result.stderr
        assert_all_gone(daemons)
    finally:
        for pid in daemons:  # no marker reaches them: the leak checks cannot see them
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# -- pre-flight verdicts ---------------------------------------------------------------------
def preflight(*hosts_and_args: str) -> str:
    result = run_poprun(*hosts_and_args, OFFLINE, "--ssh-timeout", "5", "true", timeout=30)
    assert result.returncode == EXIT_PREFLIGHT, result.stderr
    return result.stderr.decode()


def test_unreachable_hosts_each_get_a_verdict_at_once(home: Path) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never says a word
    try:
        stderr = run_poprun("-H", f"nodeA,nonexistent.invalid,127.0.0.9:1,127.0.0.1:{silent.getsockname()[1]}",
                            "--num-instances", "4", "--num-replicas", "4", OFFLINE, "--ssh-timeout", "2", "true",
                            timeout=30)
    finally:
        silent.close()
    assert stderr.returncode == EXIT_PREFLIGHT
    text = stderr.stderr.decode()
    assert "3 of 4 remote hosts failed the pre-flight checks (1 passed)" in text
    assert "nonexistent.invalid: name resolution:" in text
    assert "127.0.0.9:1: connect: cannot connect" in text
    assert "(if :1 was meant as mpirun's slot count: poprun-py reads host:N as the SSH port" in text  # -H a:2
    assert "ssh handshake: no SSH server answered" in text


def test_ctrl_c_during_the_pre_flight_stops_at_once(home: Path) -> None:
    """Before: SIGINT waited for every host's check (here the whole --ssh-timeout), then printed
    'poprun: interrupted', not a line of poprun's log."""
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]  # accept, never say a word
    hosts = ",".join(f"127.0.0.1:{server.getsockname()[1]}" for server in silent)
    accepted = []
    try:
        launch = Launch("-H", hosts, "--num-instances", "2", "--num-replicas", "2", OFFLINE, "--ssh-timeout", "30",
                        "true")
        for server in silent:
            server.settimeout(30)
            accepted.append(server.accept()[0])  # kept open: Paramiko waits for a banner that never comes
        started = time.monotonic()  # both checks are under way: poprun waits for their verdicts
        launch.process.send_signal(signal.SIGINT)
        assert launch.finish(timeout=60) == 130
        assert time.monotonic() - started < 10
    finally:
        for sock in accepted + silent:
            sock.close()
    stderr = launch.stderr.decode()
    assert re.search(r"POPRUN \[W\] received SIGINT during the pre-flight checks of 127\.0\.0\.1:\d+, "
                     r"127\.0\.0\.1:\d+: stopped checking \(nothing was started\)$", stderr, re.M), stderr
    assert "poprun: interrupted" not in stderr


def test_unknown_host_key_says_how_to_fix_it(home: Path, sshd: SshServer) -> None:
    shutil.copy(sshd.known_hosts_without("127.0.0.3"), home / ".ssh" / "known_hosts")
    text = preflight("-H", HOSTS, "--num-instances", "2", "--num-replicas", "2")
    assert "1 of 2 remote hosts failed" in text
    assert "nodeB: host key: host key not known" in text
    assert f"ssh-keyscan -H -p {sshd.port} 127.0.0.3 >> ~/.ssh/known_hosts" in text


def test_refused_key_is_an_authentication_verdict(home: Path, sshd: SshServer) -> None:
    shutil.copy(sshd.other_key, home / ".ssh" / "id_other")
    write_config(home / ".ssh", sshd, {"nodeA": "127.0.0.2"}, key="id_other")
    text = preflight("-H", "nodeA")
    assert f"nodeA: authentication: authentication refused for user '{sshd.user}'" in text


def test_no_key_to_offer_is_an_authentication_verdict_naming_the_missing_file(home: Path, sshd: SshServer,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: 'ssh handshake: no SSH server answered properly ... (No authentication methods available)', which
    sent users to the server and the port; the server had answered, and the client had no key to offer."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    write_config(home / ".ssh", sshd, {"nodeA": "127.0.0.2"}, key="id_missing")
    text = preflight("-H", "nodeA")
    assert (f"nodeA: authentication: no key to offer for user '{sshd.user}': IdentityFile "
            f"{home / '.ssh' / 'id_missing'} does not exist and ssh-agent holds no key of the IdentityFiles "
            "(IdentitiesOnly)") in text, text
    (home / ".ssh" / "id_ed25519").unlink()
    write_config(home / ".ssh", sshd, {"nodeA": "127.0.0.2"})
    (home / ".ssh" / "config").write_text((home / ".ssh" / "config").read_text().replace(
        "  IdentityFile ~/.ssh/id_ed25519\n  IdentitiesOnly yes\n", ""))
    text = preflight("-H", "nodeA")
    assert f"nodeA: authentication: no key to offer for user '{sshd.user}': no key in ~/.ssh" in text, text


@contextlib.contextmanager
def ssh_agent_holding(key: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real ssh-agent (ours, stopped after) holding ``key``, with SSH_AUTH_SOCK pointing at it."""
    sock = key.parent / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-s", "-D", "-a", str(sock)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert agent.stdout is not None and agent.stdout.readline().startswith(b"SSH_AUTH_SOCK=")  # listening
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(key)], check=True, capture_output=True, timeout=30)
        yield
    finally:
        agent.kill()
        agent.wait(timeout=10)


@pytest.mark.parametrize("public_file", ["beside it", "absent"])
def test_identities_only_offers_the_agents_copy_of_a_passphrase_key(home: Path, sshd: SshServer, public_file: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """As ssh does: IdentitiesOnly limits the agent's keys to the IdentityFiles', it does not ignore the agent.
    Before: 'the key needs a passphrase ...; add it to ssh-agent' though it was there."""
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("no ssh-agent here")
    ssh = home / ".ssh"
    locked = ssh / "id_locked"
    shutil.copy(sshd.client_key, locked)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret pass", "-f", str(locked)], check=True,
                   capture_output=True, timeout=30)
    if public_file == "beside it":  # else its public half is read from the key's unencrypted header
        shutil.copy(sshd.client_key.with_suffix(".pub"), ssh / "id_locked.pub")
    write_config(ssh, sshd, {"nodeA": "127.0.0.2"}, key="id_locked")
    with ssh_agent_holding(ssh / "id_ed25519", monkeypatch):
        (ssh / "id_ed25519").unlink()  # only the agent's copy can open the door
        result = run_poprun("-H", "nodeA", OFFLINE, "--mpi-global-args", FORWARD_MARKER, "true")
    assert result.returncode == 0, result.stderr


def test_hosts_defined_in_included_files(home: Path, sshd: SshServer) -> None:
    """``Include`` as ssh reads it: relative to ~/.ssh, globs sorted, the including block going on after it.
    Before: Paramiko kept ``include`` as an ordinary option, and nodeA 'cannot resolve'."""
    ssh = home / ".ssh"
    (ssh / "config.d").mkdir()
    write_config(ssh, sshd, {"nodeA": "127.0.0.2"})
    (ssh / "config").rename(ssh / "config.d" / "10-nodes.conf")
    (ssh / "config.d" / "20-more.conf").write_text("Host nodeB\n  HostName 127.0.0.3\n")
    (ssh / "config").write_text(f"Host nodeB\n  Include config.d/*.conf\n  Port {sshd.port}\n"
                                f"Host *\n  Include ~/.ssh/config.d/1*.conf\n  User {sshd.user}\n"
                                f"  IdentityFile ~/.ssh/id_ed25519\n")
    result = run_poprun(*launch_args("--num-instances", "2", "--num-replicas", "2", *python_program("print_env.py")))
    assert result.returncode == 0, result.stderr
    seen = sorted(instance_lines(result.stdout), key=lambda d: d["api"]["instance"])
    assert [d["env"]["SSH_CONNECTION"].split()[2] for d in seen] == ["127.0.0.2", "127.0.0.3"]
    (ssh / "config.d" / "20-more.conf").write_text("Include config\n")  # a loop: refused, as ssh refuses it
    looped = run_poprun("-H", "nodeA", OFFLINE, "true")
    assert looped.returncode == EXIT_USAGE
    assert looped.stderr.decode().splitlines()[-1].endswith("it includes itself, or more than 16 nested Includes")


def test_missing_remote_python(home: Path) -> None:
    text = preflight("-H", "nodeA", "--remote-python", "/nonexistent/bin/python3")
    assert "nodeA: remote python: /nonexistent/bin/python3 not found there" in text


def test_remote_python_without_poprun_py(home: Path) -> None:
    bare = shutil.which("python3", path=os.path.join(sys.base_prefix, "bin"))
    assert bare and bare != sys.executable
    text = preflight("-H", "nodeA", "--remote-python", bare)
    assert "nodeA: poprun_py: poprun_py is not installed" in text and "No module named" in text
    assert "from the same clone or wheel as here (it is not on PyPI)" in text  # (not "pip install poprun-py")


def test_another_version_of_poprun_py(home: Path, tmp_path: Path) -> None:
    fake = tmp_path / "python-with-old-poprun"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {PROGRAMS / 'old_agent.py'}\n")
    fake.chmod(0o755)
    text = preflight("-H", "nodeA", "--remote-python", str(fake))
    assert "nodeA: version: poprun_py 0.0.1 (protocol 0) is installed there" in text


def test_missing_working_directory(home: Path) -> None:
    text = preflight("-H", HOSTS, "--num-instances", "2", "--num-replicas", "2",
                     "--mpi-global-args=-wdir /nonexistent/work")
    assert "nodeA: working directory: the working directory /nonexistent/work does not exist there" in text
    assert "nodeB: working directory" in text


def test_ssh_config_user_and_port_from_the_command_line_win(home: Path, sshd: SshServer) -> None:
    result = run_poprun("-H", f"{sshd.user}@127.0.0.2:{sshd.port}", OFFLINE, "--mpi-global-args", FORWARD_MARKER,
                        *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    (line,) = instance_lines(result.stdout)
    assert line["env"]["SSH_CONNECTION"].split()[2:] == ["127.0.0.2", str(sshd.port)]


def test_remote_instances_on_a_simulated_partition(home: Path) -> None:
    """Not offline: poprun allocates the partition and holds the remote instances' devices for them."""
    result = run_poprun("-H", HOSTS, "--mpi-global-args", FORWARD_MARKER, "--num-instances", "2",
                        "--num-replicas", "4", *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    seen = sorted(instance_lines(result.stdout), key=lambda d: d["api"]["instance"])
    assert [d["api"]["device_id"] for d in seen] == [4, 5]  # the two 2-IPU devices of a 4-IPU partition
    assert {d["env"]["IPUOF_VIPU_API_PARTITION_ID"] for d in seen} == {seen[0]["env"]["IPUOF_VIPU_API_PARTITION_ID"]}


def test_remote_agents_bind_their_instances_to_numa_nodes(home: Path) -> None:
    show = "import os, popdist; print(popdist.getInstanceIndex(), sorted(os.sched_getaffinity(0)))"
    result = run_poprun(*launch_args("--num-instances", "4", "--num-replicas", "4", "--numa-aware=yes", "--vv",
                                     sys.executable, "-c", show))
    assert result.returncode == 0, result.stderr
    cpus = sorted(os.sched_getaffinity(0))
    assert sorted(result.stdout.splitlines()) == [f"{i} {cpus}".encode() for i in range(4)]
    stderr = result.stderr.decode()
    for index, host in ((0, "nodeA"), (3, "nodeB")):
        assert f"instance {index} on {host}: CPUs {format_cpus(cpus)}" in stderr


def test_print_topology_leaves_remote_instances_cpus_to_their_agents(home: Path) -> None:
    """Before, --print-topology showed this host's CPUs for nodeA's and nodeB's instances; their agents bind them
    by their own hosts' NUMA nodes (--vv shows what they chose)."""
    result = run_poprun(*launch_args("--num-instances", "2", "--num-replicas", "2", "--numa-aware=yes",
                                     "--print-topology=yes", "true"))
    assert result.returncode == 0, result.stderr
    stderr = result.stderr.decode()
    for index, host in ((0, "nodeA"), (1, "nodeB")):
        assert f"instance {index} on {host}: CPUs chosen there by its agent" in stderr, stderr


def test_remote_agents_bind_each_instance_to_a_core_as_mpirun_does(home: Path) -> None:
    """``--mpi-local-args='--bind-to core'`` reaches each agent: its two instances get a CPU each, in order."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two instances on a core each need two CPUs in poprun's cpuset")
    show = "import os, popdist; print(popdist.getInstanceIndex(), sorted(os.sched_getaffinity(0)))"
    result = run_poprun(*launch_args("--num-instances", "4", "--num-replicas", "4", "--mpi-local-args=--bind-to core",
                                     sys.executable, "-c", show))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"{i} {[cpus[i % 2]]}".encode() for i in range(4)]


# -- hosts that stop answering -----------------------------------------------------------------
def with_ssh_options(home: Path, **options: str) -> None:
    """``Host *`` options after the hosts' own blocks (in ssh_config the first value obtained wins)."""
    with open(home / ".ssh" / "config", "a") as config:
        config.write("Host *\n" + "".join(f"  {name} {value}\n" for name, value in options.items()))


def remote_agent(sshd: SshServer, address: str) -> psutil.Process:
    def is_agent(proc: psutil.Process) -> bool:
        try:
            return ("poprun_py.executors.agent" in " ".join(proc.cmdline())
                    and proc.environ().get("SSH_CONNECTION", "").split()[2:3] == [address])
        except psutil.Error:
            return False  # gone meanwhile (a session's short-lived helper)

    (agent,) = [p for p in sshd.session_processes() if is_agent(p)]
    return agent


def test_a_host_whose_sshd_stops_answering_is_lost_within_the_keepalive_bound(home: Path, sshd: SshServer) -> None:
    """SIGSTOP of the per-connection sshd: TCP still acknowledges, only a keepalive that needs a reply notices."""
    with_ssh_options(home, ServerAliveInterval="1", ServerAliveCountMax="2")  # lost within (2 + 1) x 1 s
    launch = Launch(*launch_args("--num-instances", "2", "--num-replicas", "2",
                                 *python_program("behave.py", "--ready", "--others", "sleep")))
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    session = remote_agent(sshd, "127.0.0.3").parent()  # the sshd process that relays the agent's channel
    assert session is not None and session.name() == "sshd"
    session.suspend()
    try:
        assert launch.finish(timeout=30) != 0  # today's poprun waits for ever
        stderr = launch.stderr.decode()
        assert ("lost nodeB: no answer to SSH keepalives for 2s (ServerAliveInterval 1 x ServerAliveCountMax 2)"
                in stderr), stderr
        assert "instance 1 of 2" in stderr
        assert_all_gone(pids)  # nodeB's agent heard nothing for its own bound: it stopped its instance itself
    finally:
        session.resume()  # its sshd then sees the closed connection and goes: the autouse check waits for it


def test_a_bad_keepalive_setting_is_a_usage_error(home: Path) -> None:
    with_ssh_options(home, ServerAliveInterval="often")
    result = run_poprun("-H", "nodeA", OFFLINE, "true")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.decode().splitlines()[-1].endswith(
        "~/.ssh/config for nodeA: ServerAliveInterval 'often' is not a number")


# -- host keys -----------------------------------------------------------------------------------
def saved_key(known_hosts: Path, name: str) -> str | None:
    found = paramiko.HostKeys(str(known_hosts)).lookup(name)
    return found["ssh-ed25519"].get_base64() if found and "ssh-ed25519" in found else None


def server_key(sshd: SshServer) -> str:
    return sshd.host_key.with_suffix(".pub").read_text().split()[1]


@pytest.mark.parametrize("hashed", ["yes", "no"])
def test_accept_new_saves_a_new_key_and_refuses_a_changed_one(home: Path, sshd: SshServer, hashed: str) -> None:
    known = home / ".ssh" / "known_hosts"
    known.write_text("")
    with_ssh_options(home, StrictHostKeyChecking="accept-new", HashKnownHosts=hashed)
    name = f"[127.0.0.2]:{sshd.port}"
    first = run_poprun("-H", "nodeA", OFFLINE, "true")
    assert first.returncode == 0, first.stderr
    assert f"nodeA: permanently added the host key of {name} (ssh-ed25519 SHA256:" in first.stderr.decode()
    assert saved_key(known, name) == server_key(sshd)  # as ssh(1) writes it: the next run checks it
    assert known.read_text().startswith("|1|" if hashed == "yes" else f"{name} ssh-ed25519 ")
    again = run_poprun("-H", "nodeA", OFFLINE, "true")
    assert again.returncode == 0 and b"permanently added" not in again.stderr, again.stderr
    other = sshd.other_key.with_suffix(".pub").read_text().split()[1]
    known.write_text(f"{name} ssh-ed25519 {other}\n")  # the host's key has changed since
    text = preflight("-H", "nodeA")
    verdicts = [line for line in text.splitlines() if line.startswith("  ")]
    assert verdicts == [f"  nodeA: host key changed: the ssh-ed25519 key of {name} differs from the one in "
                        "known_hosts (someone may be intercepting the connection); if the host was reinstalled, "
                        f"remove the old key with ssh-keygen -R '{name}'"]
    assert known.read_text() == f"{name} ssh-ed25519 {other}\n"  # never replaced


def test_strict_host_key_checking_no_warns_in_poprun_log_format(home: Path, sshd: SshServer) -> None:
    (home / ".ssh" / "known_hosts").write_text("")
    with_ssh_options(home, StrictHostKeyChecking="no", HashKnownHosts="no")
    result = run_poprun("-H", "nodeA", OFFLINE, "true")
    assert result.returncode == 0, result.stderr
    warning = re.compile(rb"^\d\d:\d\d:\d\d\.\d{3} \d+ POPRUN \[W\] nodeA: StrictHostKeyChecking no: accepted the "
                         rb"host key of \[127\.0\.0\.2\]:%d \(ssh-ed25519 SHA256:\S+\) without verifying it"
                         % sshd.port, re.M)
    assert warning.search(result.stderr), result.stderr
