"""The V-IPU server and device locks under hostile input: no token, idle floods, lying headers, symlinks.

Every server here is a real ``simipu vipu-server`` process; every client is
a raw socket or ``VipuClient``; every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from poprun_py import errors
from simipu.cli import EXIT_CODES
from simipu.devices import UnsafeDeviceDir, attach
from simipu.vipu import (
    NotEnoughIpus,
    PartitionNotFound,
    PartitionRequest,
    VipuClient,
    VipuService,
    VipuUnauthorized,
    VipuUnreachable,
)
from simipu.vipu.api import default_token_path, parse_server
from simipu.vipu.errors import VipuProtocolError, VipuStateError
from simipu.vipu.testing import RunningServer, server_process, start_server_process, stop_process
from simipu.vipu.token import read_token
from support import RUN_TIMEOUT, poprun_command, run_poprun

REPLY_WAIT = 30.0
"""Bound on any raw read in these tests: far beyond the server's own limits (5 s per read, 15 s per request)."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with server_process(tmp_path / "vipu.sqlite", cluster="pod16") as running:
        yield running


def raw(server: RunningServer, head: str, body: bytes = b"", *, close_write: bool = True,
        encoding: str = "utf-8") -> tuple[int, dict]:
    """Send ``head`` (request line and headers, CRLF-separated, without the blank line) and ``body``; parse the reply."""
    with socket.create_connection((server.host, server.port), timeout=REPLY_WAIT) as sock:
        sock.sendall(head.encode(encoding) + b"\r\n\r\n" + body)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}")


def token() -> str:
    """The server's token (it made it where its clients look: the same XDG_STATE_HOME)."""
    return read_token(default_token_path(), missing_ok=True) or ""


# -- 8: changes need the server's token -----------------------------------------


def test_changes_without_the_token_are_refused_and_reads_stay_open(server: RunningServer) -> None:
    owner = server.client()
    owner.create_partition(PartitionRequest("job", 4))
    request = json.dumps({"name": "intruder", "size": 4}).encode()
    for head, body in ((f"POST /v1/partitions HTTP/1.0\r\nContent-Length: {len(request)}", request),
                       ("POST /v1/partitions/job/fail HTTP/1.0", b""),
                       ("POST /v1/partitions/job/reset HTTP/1.0", b""),
                       ("DELETE /v1/partitions/job HTTP/1.0", b""),
                       ("DELETE /v1/partitions/job HTTP/1.0\r\nAuthorization: Bearer " + "0" * 64, b"")):
        status, reply = raw(server, head, body)
        assert (status, reply["error"]["kind"]) == (401, "unauthorized"), head
    assert [p.name for p in owner.list_partitions()] == ["job"]  # nothing changed
    assert owner.get_partition("job").state == "PS_ACTIVE"
    assert raw(server, "GET /v1/partitions HTTP/1.0")[0] == 200  # reads are open (see the README)
    with pytest.raises(VipuUnauthorized):
        server.client(authenticated=False).remove_partition("job")
    assert owner.remove_partition("job").name == "job"  # the token's holder can


def test_the_token_file_is_the_owners_alone(server: RunningServer) -> None:
    assert stat.S_IMODE(default_token_path().stat().st_mode) == 0o600
    default_token_path().chmod(0o644)  # readable by others: its secret would be everyone's
    from simipu.private_files import UnsafePath

    with pytest.raises(UnsafePath, match="chmod 600"):
        server.client()


def test_poprun_sends_the_token_and_fails_clearly_without_it(server: RunningServer, tmp_path: Path) -> None:
    where = ["--vipu-server-host", server.host, "--vipu-server-port", str(server.port), "--num-replicas", "2"]
    assert run_poprun(*where, "true").returncode == 0  # found the server's token where the server put it
    without = run_poprun(*where, "true", env={**os.environ, "SIMIPU_VIPU_TOKEN_FILE": str(tmp_path / "none")})
    assert without.returncode == errors.EXIT_VIPU_ERROR
    assert len(without.stderr.splitlines()) == 1 and b"token" in without.stderr


def test_listening_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    running = start_server_process(tmp_path / "vipu.sqlite", host="0.0.0.0")
    try:
        running.process.terminate()
        running.process.wait(REPLY_WAIT)
        log = running.process.stderr.read()
    finally:
        stop_process(running.process)
    assert b"beyond this host" in log


# -- 9: timeouts and a connection cap ---------------------------------------------


def test_a_thousand_idle_connections_do_not_lock_out_a_request(tmp_path: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2400:
        pytest.skip(f"needs 2400 open files in the test process, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2400), hard))
    idle: list[socket.socket] = []
    # 1,100 idle connections to a server allowed 1,024 descriptors (many systems' default)
    with server_process(tmp_path / "vipu.sqlite", open_files=1024) as running:
        try:
            for _ in range(1100):
                idle.append(socket.create_connection((running.host, running.port), timeout=REPLY_WAIT))
            client = running.client(timeout=REPLY_WAIT)
            assert client.create_partition(PartitionRequest("p", 4)).ipus == (0, 1, 2, 3)
            assert [p.name for p in client.list_partitions()] == ["p"]
        finally:
            for sock in idle:
                sock.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_negative_content_length_is_refused(server: RunningServer) -> None:
    status, reply = raw(server, f"POST /v1/partitions HTTP/1.0\r\nAuthorization: Bearer {token()}\r\n"
                                "Content-Length: -1", b'{"name": "p", "size": 4}', close_write=False)
    assert status == 400 and "Content-Length" in reply["error"]["message"]


@pytest.mark.parametrize("path, length, body, said", [
    ("/v1/partitions", "\u00b2", b"{}", "Content-Length"),  # (a digit to str.isdigit, not to int())
    ("/v1/partitions", None, b'{"request": {"name": "p", "size": 4}, "holder": [1, 2]}', "a lease must be a JSON object"),
    ("/v1/partitions", None, b'{"request": {"name": "p", "size": 4}, "holder": {"host": 1}}', "a lease lacks the field"),
    ("/v1/leases/reclaim", None, b"{}", "a lease must be a JSON object, got NoneType"),
    ("/v1/leases/reclaim", None, b'{"lease": "x"}', "a lease must be a JSON object, got str"),
], ids=["superscript length", "holder a list", "holder without fields", "no lease", "lease a string"])
def test_a_malformed_request_from_a_token_holder_is_a_400_not_a_server_error(
        server: RunningServer, path: str, length: str | None, body: bytes, said: str) -> None:
    """Before: 500 "protocol_error" (and a traceback in the server's log for the length)."""
    head = (f"POST {path} HTTP/1.0\r\nAuthorization: Bearer {token()}\r\n"
            f"Content-Length: {len(body) if length is None else length}")
    status, reply = raw(server, head, body, encoding="latin-1")  # (HTTP headers are Latin-1: one byte 0xB2)
    assert status == 400 and reply["error"]["kind"] == "invalid_request", reply
    assert said in reply["error"]["message"], reply
    assert server.client().list_partitions() == []


@pytest.mark.parametrize("answer, said", [
    (b'{"partitions": "x"}', 'listed its partitions as "x", not a list of JSON objects'),
    (b'{"partitions": [1]}', "listed its partitions as [1], not a list of JSON objects"),
    (b"[]", "answered a JSON list, not the object of the V-IPU API"),
], ids=["a string", "a list of numbers", "a list"])
def test_a_server_answering_json_of_the_wrong_shape_is_named_as_such(answer: bytes, said: str) -> None:
    """Before: 'a partition is not valid JSON' of valid JSON (the client parsed each character), 'answered list'."""
    reply = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + answer

    def answer_once(listener: socket.socket) -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(reply)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=answer_once, args=(listener,), daemon=True)
        thread.start()
        with pytest.raises(VipuProtocolError) as error:
            VipuClient("127.0.0.1", port=listener.getsockname()[1], timeout=REPLY_WAIT).list_partitions()
        thread.join(REPLY_WAIT)
    assert said in str(error.value)


def test_a_short_body_gets_an_error_not_a_hung_handler(server: RunningServer) -> None:
    status, reply = raw(server, f"POST /v1/partitions HTTP/1.0\r\nAuthorization: Bearer {token()}\r\n"
                                "Content-Length: 100", b'{"name": "p"', close_write=False)  # 12 of 100 bytes, then silence
    assert status == 408
    assert server.client().list_partitions() == []


def test_the_client_gives_up_on_a_dribbling_server_at_its_deadline() -> None:
    reply = b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"partitions": []}' + b" " * 200
    stop = threading.Event()
    sent = []

    def dribble(listener: socket.socket) -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            for byte in reply:  # one byte every 0.2 s: each read is quick, the reply takes 50 s
                if stop.wait(0.2):
                    return
                try:
                    connection.sendall(bytes([byte]))
                except OSError:
                    return
                sent.append(byte)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=dribble, args=(listener,), daemon=True)
        thread.start()
        try:
            with pytest.raises(VipuUnreachable, match="no answer within 1 s"):
                VipuClient("127.0.0.1", port=listener.getsockname()[1], timeout=1.0).list_partitions()
            assert len(sent) < len(reply)  # it gave up while the server was still sending
        finally:
            stop.set()
            thread.join(REPLY_WAIT)


# -- 10: lock files and state directories -----------------------------------------


def test_a_planted_symlink_lock_is_refused_and_its_target_unchanged(tmp_path: Path) -> None:
    service = VipuService(tmp_path / "vipu.sqlite", cluster="pod16")
    partition = service.create_partition(PartitionRequest("p", 1))
    devices = tmp_path / "devices"
    (devices / "cluster0").mkdir(parents=True, mode=0o700)
    devices.chmod(0o700)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret\n")
    secret.chmod(0o600)
    (devices / "cluster0" / "ipu0000.lock").symlink_to(secret)
    with pytest.raises(UnsafeDeviceDir, match="symlink"):
        attach(partition, 0, device_dir=devices)
    assert secret.read_bytes() == b"root's secret\n"


@pytest.mark.parametrize("directory, how, advice", [
    ("poprun-py", "owned by nobody", "another user could read or replace what poprun keeps in it: set XDG_STATE_HOME "
                                     "to a directory you own"),
    ("poprun-py", "writable by all", "can be written by other users (mode 0777); run 'chmod 700 {unsafe}'"),
    ("poprun-py/devices", "owned by nobody", "set XDG_STATE_HOME to a directory you own"),
], ids=["owned by nobody", "writable by all", "its devices owned by nobody"])
def test_a_state_directory_others_can_change_is_refused(directory: str, how: str, advice: str) -> None:
    """As ssh refuses a ~/.ssh that is not the user's alone: another user could read or replace the partitions
    and device locks kept there. Before, exit 77 ("unsafe V-IPU state directory"), as if the V-IPU service had
    refused; it is this machine's setting: exit 2, one line naming the directory, the variable and what to do."""
    unsafe = Path(os.environ["XDG_STATE_HOME"]) / directory
    unsafe.mkdir(mode=0o700, parents=True)
    unsafe.parent.chmod(0o700)
    if how == "owned by nobody":
        give_to_nobody(unsafe)
    else:
        unsafe.chmod(0o777)
    result = run_poprun("--num-replicas", "1", "sh", "-c", "echo ran")
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert len(lines) == 1 and lines[0].startswith("poprun: error: refusing the state directory (XDG_STATE_HOME="), lines
    assert f"{unsafe} " in lines[0] and advice.format(unsafe=unsafe) in lines[0], lines
    assert result.stdout == b""
    assert not list(unsafe.glob("**/*.lock")) and not list(unsafe.glob("*.sqlite"))  # nothing written in it


def test_a_state_directory_owned_by_another_user_with_a_vipu_server_is_a_local_error(server: RunningServer) -> None:
    """With --vipu-server-host the state directory holds the device locks: before, exit 77 (the V-IPU service's
    code) for a directory the user had to change; now exit 2, as without a server, and the partition let go."""
    unsafe = default_token_path().parent  # the server's token is there, as it is by default
    give_to_nobody(unsafe)
    env = {**os.environ, "SIMIPU_VIPU_TOKEN_FILE": str(default_token_path())}
    result = run_poprun("--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server.port),
                        "--num-replicas", "1", "true", env=env)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert len(lines) == 1 and f"{unsafe} belongs to uid " in lines[0] and "XDG_STATE_HOME to a directory you own" \
        in lines[0], lines
    assert server.client().list_partitions() == []


#: Runs a command as root without the capabilities that let root write any directory: the kernel then checks
#: a directory's mode bits for it as for any user (os.setuid would do too, were this interpreter not under /root).
AS_AN_ORDINARY_WRITER = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
                         "--bounding-set=-dac_override,-dac_read_search")


def test_a_state_directory_you_cannot_write_is_a_local_error() -> None:
    """Your own state directory, mode 0500: before, exit 77 and "cannot use the V-IPU state file ...: unable to
    open database file" (sqlite's words); now exit 2, naming the directory, its mode and what to do."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping root's power to write any directory needs root and setpriv")
    state = Path(os.environ["XDG_STATE_HOME"]) / "poprun-py"
    state.mkdir(mode=0o700, parents=True)
    state.chmod(0o500)
    result = subprocess.run([*AS_AN_ORDINARY_WRITER, *poprun_command("--num-replicas", "1", "true")],
                            capture_output=True, timeout=RUN_TIMEOUT)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert lines == [f"poprun: error: cannot write the state directory {state} (XDG_STATE_HOME={state.parent}): it is "
                     f"not writable for you (mode 0500); run 'chmod 700 {state}', or set XDG_STATE_HOME to a directory "
                     "you can write"], lines
    assert list(state.iterdir()) == []


def test_a_state_directory_on_a_read_only_file_system_is_a_local_error(tmp_path: Path) -> None:
    """Before, exit 77 and sqlite's "unable to open database file"; now exit 2, saying the file system is read-only."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root and mount")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)], capture_output=True,
                             timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (tmp_path / "poprun-py").mkdir(mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(tmp_path)], check=True, capture_output=True, timeout=30)
        result = run_poprun("--num-replicas", "1", "true", env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True, timeout=30)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert lines == [f"poprun: error: cannot write the state directory {tmp_path}/poprun-py (XDG_STATE_HOME={tmp_path}): "
                     "it is on a read-only file system; set XDG_STATE_HOME to a directory you can write"], lines


@pytest.mark.parametrize("variable", ["XDG_STATE_HOME", "HOME"])
def test_a_state_directory_that_cannot_be_made_is_a_local_error_naming_the_variable(tmp_path: Path,
                                                                                     variable: str) -> None:
    """XDG_STATE_HOME (or HOME, XDG_STATE_HOME unset) naming a file: before, exit 77, "the V-IPU service refused"
    though no service was asked anything; now exit 2, one line naming the directory, the variable and the file."""
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    env = {**os.environ, variable: str(a_file)}
    if variable == "HOME":
        del env["XDG_STATE_HOME"]
    result = run_poprun("--num-replicas", "1", "sh", "-c", "echo ran", env=env)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert len(lines) == 1 and lines[0].startswith("poprun: error: cannot create the state directory "), lines
    assert f"({variable}={a_file}" in lines[0] and f"{a_file} is not a directory" in lines[0], lines
    assert result.stdout == b""


def test_a_state_directory_that_cannot_be_made_with_a_vipu_server_is_a_local_error(server: RunningServer,
                                                                                  tmp_path: Path) -> None:
    """With --vipu-server-host, poprun's own state directory holds the device locks (and the token, by default):
    before, XDG_STATE_HOME naming a file was an internal error, exit 70 (NotADirectoryError); now as without."""
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    env = {**os.environ, "XDG_STATE_HOME": str(a_file), "SIMIPU_VIPU_TOKEN_FILE": str(default_token_path())}
    result = run_poprun("--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server.port),
                        "--num-replicas", "1", "true", env=env)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == errors.EXIT_USAGE, lines
    assert len(lines) == 1 and f"(XDG_STATE_HOME={a_file}): {a_file} is not a directory" in lines[0], lines
    assert server.client().list_partitions() == []  # the partition made for the launch was let go


def test_state_directories_are_created_private() -> None:
    assert run_poprun("--num-replicas", "1", "true").returncode == 0
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "poprun-py"
    for directory in (state_dir, state_dir / "devices", state_dir / "devices" / "cluster0"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def simipu(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``simipu`` command (umask 022, as most users have), bounded in time."""
    return subprocess.run([sys.executable, "-m", "simipu.cli", *args], capture_output=True, text=True,
                          timeout=REPLY_WAIT, preexec_fn=lambda: os.umask(0o022))


def refusal_to_serve(state: Path) -> str:
    """Why ``simipu vipu-server --state state`` would not start; fails the test (stopping it) if it serves."""
    try:
        running = start_server_process(state)
    except RuntimeError as exc:  # it exited before listening: the message holds its exit code and stderr
        return str(exc)
    stop_process(running.process)
    pytest.fail(f"the server served {state}")


def give_to_nobody(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    import pwd

    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)


@pytest.mark.parametrize("how", ["directory writable by all", "directory owned by nobody", "file writable by all",
                                 "file owned by nobody"])
def test_a_state_file_named_with_state_is_refused_if_others_can_change_it(tmp_path: Path, how: str) -> None:
    """``--state FILE`` passed no checks: whoever could write the file or its directory could rewrite partitions and
    leases without the server's token. Now both get the default state directory's checks."""
    VipuService(tmp_path / "vipu.sqlite", cluster="pod16").create_partition(PartitionRequest("theirs", 4))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    state = shared / "vipu.sqlite"
    state.write_bytes((tmp_path / "vipu.sqlite").read_bytes())
    state.chmod(0o644)
    culprit, what = (shared, "directory") if how.startswith("directory") else (state, "file")
    if how.endswith("owned by nobody"):
        give_to_nobody(culprit)
    else:
        culprit.chmod(0o1777 if what == "directory" else 0o666)
    before = state.read_bytes()
    created = simipu("vipu", "create", "partition", "stolen", "--size", "4", "--state", str(state))
    assert created.returncode == EXIT_CODES[VipuStateError], created
    assert created.stderr.count("\n") == 1, created.stderr
    assert created.stderr.startswith(f"simipu: error: unsafe V-IPU state {what}: {culprit} "), created.stderr
    advice = "chmod go-w" if how == "file writable by all" else "run 'simipu vipu-server' over it"
    assert advice in created.stderr
    refused = refusal_to_serve(state)
    assert f"(exit {EXIT_CODES[VipuStateError]}): simipu: error: unsafe V-IPU state {what}: {culprit} " in refused
    assert state.read_bytes() == before  # nothing written through it


def test_a_state_file_named_with_state_gets_private_directories_and_works(tmp_path: Path) -> None:
    """Missing directories of ``--state`` were made 0755 (the umask's); now 0700, as the default state directory."""
    state = tmp_path / "new" / "sub" / "vipu.sqlite"
    created = simipu("vipu", "create", "partition", "mine", "--size", "4", "--state", str(state))
    assert created.returncode == 0, created.stderr
    for directory in (tmp_path / "new", tmp_path / "new" / "sub"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    link = tmp_path / "link.sqlite"  # a symlink of one's own to one's own private file is fine too
    link.symlink_to(state)
    with server_process(link, cluster="pod64") as running:  # and a server over it serves
        assert [p.name for p in running.client().list_partitions()] == ["mine"]


# -- the report's rough edges: every refusal in the API's JSON, and said right --------------------------------
def request(server: RunningServer, method: str, path: str, body: object = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], dict]:
    """One request with the server's token: the status, the headers and the JSON reply ({} for none)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=REPLY_WAIT)
    try:
        connection.request(method, path, body=body, headers={"Authorization": f"Bearer {token()}", **(headers or {})},
                           encode_chunked=isinstance(body, list))
        response = connection.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else {}
    finally:
        connection.close()


@pytest.mark.parametrize("method", ["PATCH", "OPTIONS", "HEAD", "TRACE"])
def test_a_method_the_api_lacks_is_405_with_allow_in_json(server: RunningServer, method: str) -> None:
    """Before: Python's HTML page, 501 Unsupported method."""
    status, headers, reply = request(server, method, "/v1/partitions")
    assert (status, headers["Allow"], headers["Content-Type"]) == (405, "GET, POST, PUT, DELETE", "application/json")
    if method != "HEAD":  # (a reply to HEAD has no body)
        assert reply["error"]["kind"] == "protocol_error" and f"no method {method}" in reply["error"]["message"]


def test_a_chunked_body_is_refused_not_read_as_empty(server: RunningServer) -> None:
    """Before: the chunks were ignored and the request said to lack the field 'name'."""
    status, _, reply = request(server, "POST", "/v1/partitions", [json.dumps({"name": "q", "size": 2}).encode()])
    assert status == 411 and "Content-Length, not Transfer-Encoding" in reply["error"]["message"], reply
    assert server.client().list_partitions() == []


def test_a_refused_name_is_not_echoed_back_whole(server: RunningServer) -> None:
    status, _, reply = request(server, "POST", "/v1/partitions", json.dumps({"name": "x" * 100_000, "size": 2}))
    message = reply["error"]["message"]
    assert status == 400 and "invalid partition name 'xxxx" in message and "(100002 characters)" in message
    assert len(message) < 300, len(message)


def test_routing_and_sync_types_are_checked_by_the_server(server: RunningServer) -> None:
    status, _, reply = request(server, "POST", "/v1/partitions", json.dumps({"name": "q", "size": 2, "sync_type": "bogus"}))
    assert status == 400 and "sync type 'bogus' is not one of pod-native-default" in reply["error"]["message"]


def test_removing_a_missing_partition_does_not_say_create_it(server: RunningServer) -> None:
    removed = simipu("vipu", "remove", "partition", "nosuch", "--server", server.address)
    assert removed.returncode == EXIT_CODES[PartitionNotFound], removed.stderr
    assert removed.stderr == ("simipu: error: no V-IPU partition named 'nosuch'; 'simipu vipu list partitions' lists "
                              "those there are\n")


def test_an_empty_state_path_is_a_usage_error(tmp_path: Path) -> None:
    """Before: "cannot use the V-IPU state file <the current directory>" (exit 11)."""
    listed = subprocess.run([sys.executable, "-m", "simipu.cli", "vipu", "list", "partitions", "--state", ""],
                            capture_output=True, text=True, timeout=REPLY_WAIT, cwd=tmp_path)
    assert listed.returncode == 2 and listed.stderr.count("\n") == 1, listed.stderr
    assert "--state" in listed.stderr and "the path is empty" in listed.stderr


def test_a_full_cluster_is_said_right_and_advised_once(tmp_path: Path) -> None:
    """Before: "0 of 64 IPUs are free, but not 16 together", and poprun added a second piece of advice."""
    VipuService(state := tmp_path / "vipu.sqlite", cluster="pod16").create_partition(PartitionRequest("all", 16))
    with pytest.raises(NotEnoughIpus, match="all 16 IPUs are in partitions; wait for a running job to end"):
        VipuService(state).create_partition(PartitionRequest("more", 4))
    VipuService(state).remove_partition("all")
    VipuService(state).create_partition(PartitionRequest("half", 8))
    with pytest.raises(NotEnoughIpus, match="only 8 of 16 IPUs are free"):
        VipuService(state).create_partition(PartitionRequest("more", 16))
    VipuService(Path(os.environ["XDG_STATE_HOME"]) / "poprun-py" / "vipu.sqlite").create_partition(
        PartitionRequest("everything", 64))
    launched = run_poprun("--num-replicas", "4", "true")
    assert launched.returncode == errors.EXIT_NO_DEVICES, launched.stderr
    line = launched.stderr.decode()
    assert "all 64 IPUs are in partitions" in line and line.count("remove a partition") == 1, line


@pytest.mark.parametrize("address, parsed", [
    ("127.0.0.1", ("127.0.0.1", 8090)), ("h:1", ("h", 1)), ("[::1]", ("::1", 8090)), ("[::1]:9", ("::1", 9)),
    ("fe80::", ("fe80::", 8090)), ("::1", ("::1", 8090)),  # a bare IPv6 address may end in ':'
])
def test_a_server_address_is_host_and_port(address: str, parsed: tuple[str, int]) -> None:
    assert parse_server(address) == parsed


@pytest.mark.parametrize("address", ["127.0.0.1:", "[::1]:", "h:x", ":", "[::1]x"])
def test_a_server_address_with_a_colon_and_no_port_is_refused(address: str) -> None:
    """Before, '127.0.0.1:' was the default port, while poprun -H refused 'a:'."""
    with pytest.raises(ValueError, match="invalid server address"):
        parse_server(address)
