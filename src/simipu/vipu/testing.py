"""Test helpers: a V-IPU server in its own process, and many allocators released at once.

Used by simipu's tests and available to the launcher's: ``server_process``
starts ``simipu vipu-server`` on a free port and stops it (SIGTERM, then
SIGKILL) however the test ends; ``concurrent_allocations`` starts processes
that each create partitions as soon as a common start line arrives, to
show that no IPU ever lands in two partitions. Every wait is bounded.

``start_holder`` starts a process that attaches to a device and keeps it
(another user of the IPUs, for the guide's "Known issues" race).
``python -m simipu.vipu.testing allocate|hold ...`` are those programs.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Iterator, Optional, Sequence

from simipu.vipu.api import open_vipu, parse_server
from simipu.vipu.client import VipuClient
from simipu.vipu.errors import VipuError
from simipu.vipu.models import PartitionRequest


@dataclass(frozen=True)
class RunningServer:
    """A ``simipu vipu-server`` process and where it listens."""

    host: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        """HOST:PORT as ``--server`` takes it ([::1]:PORT for IPv6)."""
        from simipu.fabric.join.addresses import host_port

        return host_port(self.host, self.port)

    def client(self, timeout: float = 10.0, authenticated: bool = True) -> VipuClient:
        """A client of this server, with the token of ``default_token_path()`` (where the server put it)."""
        from simipu.vipu.api import default_token_path
        from simipu.vipu.token import read_token

        token = read_token(default_token_path(), missing_ok=True) if authenticated else None
        return VipuClient(self.host, port=self.port, timeout=timeout, token=token)


def read_line(stream: IO[bytes], deadline: float) -> bytes:
    """Read one line from a pipe, giving up (TimeoutError) at ``deadline`` (time.monotonic)."""
    data = bytearray()
    fd = stream.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise TimeoutError(f"no complete line within the deadline (got {bytes(data)!r})")
            chunk = os.read(fd, 1)
            if not chunk:
                break
            data += chunk
    return bytes(data)


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> Optional[int]:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(grace)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return process.returncode


def start_server_process(state_path: os.PathLike[str] | str, *, cluster: Optional[str] = None,
                         host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0,
                         options: Sequence[str] = (), open_files: Optional[int] = None) -> RunningServer:
    """Start ``simipu vipu-server`` (with more ``options``) and wait until it says where it listens.

    ``open_files`` lowers the server's descriptor limit (1024 is many systems' default).
    """
    command = [sys.executable, "-m", "simipu.cli", "vipu-server", "--host", host, "--port", str(port),
               "--state", os.fspath(state_path), *options]
    if cluster is not None:
        command += ["--cluster", cluster]

    def limit_open_files() -> None:
        if open_files is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=limit_open_files if open_files is not None else None)
    assert process.stdout is not None and process.stderr is not None
    try:
        line = read_line(process.stdout, time.monotonic() + startup_timeout).decode()
    except BaseException:
        stop_process(process)
        raise
    if "listening on " not in line:
        try:
            process.wait(startup_timeout)  # it is exiting: let it finish saying why
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        why = process.stderr.read().decode(errors="replace").strip() or line.strip() or "no output"
        stop_process(process)
        raise RuntimeError(f"simipu vipu-server did not start (exit {process.returncode}): {why}")
    bound_host, bound_port = parse_server(line.split("listening on ", 1)[1].split()[0])
    return RunningServer(bound_host, bound_port, process)


@contextmanager
def server_process(state_path: os.PathLike[str] | str, **kwargs: object) -> Iterator[RunningServer]:
    """A running ``simipu vipu-server`` for the duration of the block (arguments as start_server_process)."""
    server = start_server_process(state_path, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        stop_process(server.process)


def concurrent_allocations(target: Sequence[str], processes: int, count: int, size: int,
                           timeout: float = 60.0) -> list[dict[str, object]]:
    """Start ``processes`` allocators, release them together, return every attempt's outcome.

    ``target`` is ``["--state", PATH]`` or ``["--server", "HOST:PORT"]``.
    Each outcome is ``{"name", "ipus"}`` or ``{"name", "error": kind}``.
    """
    deadline = time.monotonic() + timeout
    started: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(processes):
            started.append(subprocess.Popen(
                [sys.executable, "-m", "simipu.vipu.testing", "allocate", *target, "--prefix", f"w{index}-",
                 "--count", str(count), "--size", str(size)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for process in started:
            assert process.stdout is not None and process.stderr is not None
            if read_line(process.stdout, deadline) != b"ready\n":
                raise RuntimeError(f"allocator {process.args!r} did not start: {process.stderr.read()!r}")
        for process in started:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            process.stdin.flush()  # communicate() closes it
        outcomes: list[dict[str, object]] = []
        for process in started:
            out, err = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            if process.returncode != 0:
                raise RuntimeError(f"allocator failed with {process.returncode}: {err.decode(errors='replace')}")
            outcomes += [json.loads(line) for line in out.splitlines()]
        return outcomes
    finally:
        for process in started:
            stop_process(process)


def _allocate(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m simipu.vipu.testing allocate")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--state")
    where.add_argument("--server")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    args = parser.parse_args(argv)
    if args.server:
        host, port = parse_server(args.server)
        api = open_vipu(host, port=port, timeout=30.0)
    else:
        api = open_vipu(state_path=args.state)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()  # the start line: every allocator goes at once
    for index in range(args.count):
        name = f"{args.prefix}{index}"
        try:
            outcome: dict[str, object] = {"name": name, "ipus": list(api.create_partition(
                PartitionRequest(name=name, size=args.size)).ipus)}
        except VipuError as exc:
            outcome = {"name": name, "error": exc.kind}
        sys.stdout.write(json.dumps(outcome) + "\n")
    sys.stdout.flush()
    return 0


def start_holder(state_path: os.PathLike[str] | str, partition: str, device_id: Optional[int] = None, *,
                 device_dir: os.PathLike[str] | str, job: Optional[str] = None,
                 timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start a process that attaches to a device and holds it until its stdin closes or it is killed.

    Returns once the device is held. If attaching fails, raises RuntimeError
    with the holder's one-line error.
    """
    command = [sys.executable, "-m", "simipu.vipu.testing", "hold", "--state", os.fspath(state_path),
               "--partition", partition, "--device-dir", os.fspath(device_dir)]
    command += ["--device", str(device_id)] if device_id is not None else []
    command += ["--job", job] if job else []
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    try:
        line = read_line(process.stdout, time.monotonic() + timeout)
    except BaseException:
        stop_process(process)
        raise
    if line != b"attached\n":
        process.wait(timeout)
        why = process.stderr.read().decode(errors="replace").strip()
        stop_process(process)
        raise RuntimeError(f"the holder could not attach: {why}")
    return process


def _hold(argv: Sequence[str]) -> int:
    from simipu.devices import DeviceError, attach

    parser = argparse.ArgumentParser(prog="python -m simipu.vipu.testing hold")
    parser.add_argument("--state", required=True)
    parser.add_argument("--partition", required=True)
    parser.add_argument("--device", type=int)
    parser.add_argument("--device-dir", required=True)
    parser.add_argument("--job")
    args = parser.parse_args(argv)
    partition = open_vipu(state_path=args.state).get_partition(args.partition)
    try:
        device = attach(partition, args.device, device_dir=args.device_dir, job=args.job)
    except DeviceError as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write("attached\n")
    sys.stdout.flush()
    sys.stdin.read()  # hold until told (EOF) or killed
    device.detach()
    return 0


if __name__ == "__main__":
    _COMMANDS = {"allocate": _allocate, "hold": _hold}
    if sys.argv[1:2] == [] or sys.argv[1] not in _COMMANDS:
        sys.exit("usage: python -m simipu.vipu.testing {allocate,hold} ... (see --help of each)")
    sys.exit(_COMMANDS[sys.argv[1]](sys.argv[2:]))
