"""What the V-IPU service can refuse, as types callers catch (never by message text).

Every error has a short ``kind`` that travels in the server's JSON replies,
so the HTTP client raises the same type the embedded service would. Messages
are one line and say what to do.
"""

from __future__ import annotations


class VipuError(Exception):
    """Base of every V-IPU error."""

    kind = "vipu_error"
    http_status = 500


class InvalidPartitionRequest(VipuError, ValueError):
    """The request itself is wrong (size not a power of two, GCDs that do not divide it, ...)."""

    kind = "invalid_request"
    http_status = 400


class PartitionTooLarge(VipuError):
    """The partition (or its ILDs) would not fit in the cluster even if it were empty."""

    kind = "partition_too_large"
    http_status = 400


class NotEnoughIpus(VipuError):
    """The cluster has room in principle, but other partitions hold the IPUs now."""

    kind = "not_enough_ipus"
    http_status = 409


class PartitionExists(VipuError):
    """A partition of that name exists already (names are unique per service)."""

    kind = "partition_exists"
    http_status = 409


class PartitionInUse(VipuError):
    """A live process holds the partition's IPUs (or owns it): only that process may change it."""

    kind = "partition_in_use"
    http_status = 409


class VipuUnauthorized(VipuError, PermissionError):
    """A change was asked without the server's credential (or with a wrong one)."""

    kind = "unauthorized"
    http_status = 401


class PartitionNotFound(VipuError, LookupError):
    """No partition of that name."""

    kind = "partition_not_found"
    http_status = 404


class ClusterNotFound(VipuError, LookupError):
    """No cluster of that name."""

    kind = "cluster_not_found"
    http_status = 404


class ClusterMismatch(VipuError):
    """The state file holds a cluster of that name with a different size."""

    kind = "cluster_mismatch"
    http_status = 409


class VipuStateError(VipuError):
    """The state file cannot be opened or is not a V-IPU state database."""

    kind = "state_error"
    http_status = 500


class StateDirUnusable(VipuStateError):
    """The user's state directory (``$XDG_STATE_HOME/poprun-py``) cannot be made: a local setting, not the service."""


class VipuProtocolError(VipuError):
    """The server answered something the client does not understand (or failed internally)."""

    kind = "protocol_error"
    http_status = 500


class VipuUnreachable(VipuError, ConnectionError):
    """The V-IPU server did not answer: refused, unknown host, or no reply within the timeout."""

    kind = "unreachable"
    http_status = 503

    def __init__(self, host: str, port: int, reason: str) -> None:
        from simipu.fabric.join.addresses import host_port  # ([::1]:8090 for IPv6; only when this happens)

        super().__init__(
            f"the V-IPU server at {host_port(host, port)} is unreachable ({reason}); "
            "check the server's host and port, and that it is running"
        )
        self.host = host
        self.port = port
        self.reason = reason


class NotAVipuServer(VipuUnreachable, VipuProtocolError):
    """Something answers at host:port, but not the V-IPU API (a web server, another service, a wrong port).

    No V-IPU service refused anything, so it is a ``VipuUnreachable`` to
    callers (exit codes, retries), and a ``VipuProtocolError`` to those who
    caught the protocol error this used to be.
    """

    def __init__(self, host: str, port: int, what: str) -> None:
        from simipu.fabric.join.addresses import host_port

        VipuError.__init__(self, f"{host_port(host, port)} is not a V-IPU server ({what}); "
                                 "check the server's host and port")
        self.host = host
        self.port = port
        self.reason = what


_BY_KIND: dict[str, type[VipuError]] = {
    cls.kind: cls
    for cls in (
        VipuError, InvalidPartitionRequest, PartitionTooLarge, NotEnoughIpus, PartitionExists,
        PartitionInUse, VipuUnauthorized, PartitionNotFound, ClusterNotFound, ClusterMismatch, VipuStateError, VipuProtocolError,
    )
}


def error_from_kind(kind: str, message: str) -> VipuError:
    """Rebuild the exception a server reported; an unknown kind becomes a VipuProtocolError."""
    cls = _BY_KIND.get(kind)
    if cls is None:
        return VipuProtocolError(f"the V-IPU server reported an unknown error kind {kind!r}: {message}")
    return cls(message)
