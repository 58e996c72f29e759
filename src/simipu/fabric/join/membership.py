"""Who is in a job's fabric, and where to reach them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The longest text field a peer entry may have (host names are at most 253 bytes).
MAX_FIELD = 1024


@dataclass(frozen=True)
class Peer:
    """One instance's data-plane addresses, as it announced them at check-in.

    ``host_id`` groups instances that share a machine (and so can share
    memory); with the transport forced to TCP every instance gets its own.
    ``unix_name`` is an abstract-namespace Unix socket name (no file to leak; unguessable, see ``connect``).
    """

    instance: int
    host_id: str
    hostname: str
    tcp_addr: tuple[str, int]
    unix_name: str | None
    pid: int

    @classmethod
    def from_wire(cls, entry: object) -> Peer:
        """A peer entry as received in JSON, checked field by field; ValueError naming what is wrong."""
        if not isinstance(entry, dict):
            raise ValueError("the peer entry is not an object")
        address = entry.get("tcp_addr")
        if not isinstance(address, list) or len(address) != 2:
            raise ValueError("tcp_addr is not a [host, port] pair")
        port = _integer(address[1], "the TCP port")
        if not 0 < port < 65536:
            raise ValueError(f"the TCP port {port} is out of range")
        unix_name = entry.get("unix_name")
        return cls(
            instance=_integer(entry.get("instance"), "instance"),
            host_id=_text(entry.get("host_id"), "host_id"),
            hostname=_text(entry.get("hostname"), "hostname"),
            tcp_addr=(_text(address[0], "the TCP host"), port),
            unix_name=None if unix_name is None else _text(unix_name, "unix_name"),
            pid=_integer(entry.get("pid"), "pid"),
        )


@dataclass(frozen=True)
class Membership:
    """The peer table every instance receives once all have checked in."""

    job_id: str
    instance: int
    peers: tuple[Peer, ...]

    @property
    def num_instances(self) -> int:
        return len(self.peers)

    @property
    def me(self) -> Peer:
        return self.peers[self.instance]

    def same_host(self, other: int) -> bool:
        return self.peers[other].host_id == self.me.host_id

    def local_instances(self) -> tuple[int, ...]:
        """The instances on this instance's host, in index order (itself included)."""
        return tuple(p.instance for p in self.peers if p.host_id == self.me.host_id)


def _integer(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} is not an integer")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD:
        raise ValueError(f"{what} is not a string of 1 to {MAX_FIELD} characters")
    return value
