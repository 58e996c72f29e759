"""The one V-IPU interface the launcher codes against, and ``open_vipu``, which builds one.

``VipuService`` (in-process, over a SQLite state file) and ``VipuClient``
(HTTP JSON to ``simipu vipu-server``) both satisfy ``VipuApi``, so a launch
with ``--vipu-server-host`` and one without differ only in which is built.
Where state lives by default is ``defaults`` (re-exported here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Protocol, runtime_checkable

from simipu.vipu.defaults import (  # noqa: F401  (re-exported: this module is where the launcher finds them)
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    STATE_FILE_NAME,
    TOKEN_FILE_ENV,
    TOKEN_FILE_NAME,
    default_state_dir,
    default_state_path,
    default_token_path,
)
from simipu.vipu.lease import Lease
from simipu.vipu.models import Cluster, Partition, PartitionRequest


@runtime_checkable
class VipuApi(Protocol):
    """Partitions and clusters of a V-IPU service; every method may raise a ``VipuError``."""

    def create_partition(self, request: PartitionRequest, holder: Optional[Lease] = None,
                         temporary: bool = False) -> Partition:
        """Allocate IPUs atomically and record the partition (state PS_ACTIVE).

        With ``holder``, its IPUs are held by that process from the start; with
        ``temporary`` too, the partition goes when that process does.
        """
        ...

    def get_partition(self, name: str) -> Partition:
        ...

    def list_partitions(self) -> list[Partition]:
        """All partitions, sorted by name."""
        ...

    def update_partition(self, name: str, request: PartitionRequest, holder: Optional[Lease] = None) -> Partition:
        """Reconfigure (and resize, if the IPUs are free) partition ``name``; back to PS_ACTIVE.

        Refused (PartitionInUse) while a live process other than ``holder``
        holds it; so are reset and remove.
        """
        ...

    def reset_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        """Return the partition to PS_ACTIVE and count the reset."""
        ...

    def remove_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        """Free the partition's IPUs; returns the partition as it was."""
        ...

    def claim_partition(self, name: str, holder: Lease) -> Partition:
        """Hold every IPU of the partition for ``holder``, or raise PartitionInUse naming who does."""
        ...

    def release_partition(self, name: str, holder: Lease) -> Partition:
        """Let go of what ``holder`` holds in the partition."""
        ...

    def reclaim(self, lease: Lease) -> list[str]:
        """Drop what a dead process (of the caller's host) held; returns the temporary partitions removed."""
        ...

    def cluster(self, name: Optional[str] = None) -> Cluster:
        """The named cluster, or the service's default one."""
        ...

    def list_clusters(self) -> list[Cluster]:
        ...

    def mark_failed(self, name: str) -> Partition:
        """Put the partition into PS_FAILED, as a hardware error would (a test and admin hook)."""
        ...


def parse_server(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split ``HOST[:PORT]`` (or ``[v6addr]:PORT``) into host and port."""
    text = address.strip()
    port_text: str | None = None  # None: no ':PORT' at all; "" a ':' with nothing after it
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"invalid server address {address!r}: expected [HOST]:PORT")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host = text  # (a bare IPv6 address, ``fe80::`` too)
    if not host:
        raise ValueError(f"invalid server address {address!r}: no host")
    if port_text is None:
        return host, default_port
    if not port_text:  # "host:", "[addr]:": a port was meant (before, the default was used silently)
        raise ValueError(f"invalid server address {address!r}: no port after ':'; give HOST or HOST:PORT")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"invalid server address {address!r}: {port_text!r} is not a TCP port (1-65535)")
    return host, int(port_text)


def open_vipu(host: Optional[str] = None, port: int = DEFAULT_PORT, timeout: float = DEFAULT_TIMEOUT,
              state_path: Optional[os.PathLike[str] | str] = None, cluster_name: Optional[str] = None,
              token_path: Optional[os.PathLike[str] | str] = None) -> VipuApi:
    """Return a client for the server at ``host``, or, with no host, the embedded service.

    This is what ``--vipu-server-host`` means: given, talk HTTP; absent, use
    the same service in-process over ``state_path`` (default
    :func:`default_state_path`). For the embedded service, ``cluster_name``
    (``--vipu-cluster``) is its default cluster, created as a POD64 if the
    state does not have it yet; a server only knows the clusters it has.
    A client sends the credential of ``token_path`` (default
    :func:`default_token_path`) if that file exists.
    """
    if host:
        from simipu.vipu.client import VipuClient
        from simipu.vipu.token import read_token

        return VipuClient(host, port=port, timeout=timeout,
                          token=read_token(Path(token_path) if token_path else default_token_path(), missing_ok=True))
    from simipu.vipu.models import DEFAULT_CLUSTER_NAME
    from simipu.vipu.service import VipuService

    return VipuService(state_path, cluster_name=cluster_name or DEFAULT_CLUSTER_NAME)
