"""Who is in a job's fabric, and where to reach them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    """One instance's data-plane addresses, as it announced them at check-in.

    ``host_id`` groups instances that share a machine (and so can share
    memory); with the transport forced to TCP every instance gets its own.
    ``unix_name`` is an abstract-namespace Unix socket name (no file to leak).
    """

    instance: int
    host_id: str
    hostname: str
    tcp_addr: tuple[str, int]
    unix_name: str | None
    pid: int


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
