"""Who holds IPUs or owns a temporary partition: a lease that dies with its process.

A ``Lease`` names a process by host, boot id, pid and the process's start
time (clock ticks since boot, from ``/proc/<pid>/stat``). Pid alone is not
enough: a pid is reused after its process ends, and the start time tells a
new process from the old one. On the host that wrote it, ``alive()`` is
exact; elsewhere it is unknown (``None``), and the next launch on the
holder's host is the one that can tell (see ``VipuApi.reclaim``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Optional

from simipu.vipu.errors import VipuProtocolError


@lru_cache(maxsize=1)
def boot_id() -> str:
    """This boot's id (a new one after every reboot), or "" where the kernel does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``): pids mean something only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[19])  # field 22 of proc(5), counted from field 3


@dataclass(frozen=True)
class Lease:
    """A process that holds something in the V-IPU service for as long as it lives."""

    host: str
    boot: str
    pid: int
    start: int
    job: Optional[str] = None
    pidns: str = ""

    @classmethod
    def of_this_process(cls, job: Optional[str] = None) -> Lease:
        pid = os.getpid()
        start = process_start(pid)
        assert start is not None  # this process exists
        return cls(host=socket.gethostname(), boot=boot_id(), pid=pid, start=start, job=job, pidns=pid_namespace())

    @property
    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> Optional[bool]:
        """True or False on the lease's own host; None elsewhere (only that host can tell).

        A lease of another pid namespace (a container with the same host name)
        is unknown too: its pid names another process here.
        """
        if not self.is_local or self.pidns != pid_namespace():
            return None
        if self.boot != boot_id():
            return False  # written before this boot: every process of it is gone
        return process_start(self.pid) == self.start

    def same_holder(self, other: Optional[Lease]) -> bool:
        """The same launch: same process and job (two launches in one process's threads are two holders)."""
        return other == self

    def describe(self) -> str:
        job = f" of job {self.job}" if self.job else ""
        return f"pid {self.pid} on {self.host}{job}"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "boot": self.boot, "pid": self.pid, "start": self.start, "job": self.job,
                "pidns": self.pidns}

    @classmethod
    def from_json(cls, data: Any) -> Lease:
        if not isinstance(data, Mapping):
            raise VipuProtocolError(f"a lease must be a JSON object, got {type(data).__name__}")
        try:
            host, boot, pid, start, job = (data["host"], data["boot"], data["pid"], data["start"], data.get("job"))
            pidns = data.get("pidns", "")
        except KeyError as exc:
            raise VipuProtocolError(f"a lease lacks the field {exc}") from None
        if not (isinstance(host, str) and host and isinstance(boot, str) and len(host) <= 255 and len(boot) <= 64):
            raise VipuProtocolError("a lease needs a host name and a boot id")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (pid, start)):
            raise VipuProtocolError("a lease's pid and start must be non-negative integers")
        if job is not None and not (isinstance(job, str) and len(job) <= 128):
            raise VipuProtocolError("a lease's job must be a string of at most 128 characters")
        if not (isinstance(pidns, str) and len(pidns) <= 64):
            raise VipuProtocolError("a lease's pidns must be a string of at most 64 characters")
        return cls(host=host, boot=boot, pid=pid, start=start, job=job, pidns=pidns)
