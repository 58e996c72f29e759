"""``VipuClient``: the ``VipuApi`` over HTTP JSON to a V-IPU server, each request within one deadline.

``timeout`` bounds a whole request: connecting, sending and reading the
reply together, not each read (a server that sends a byte every few seconds
would otherwise never time out). A server that refuses, does not resolve,
or does not answer in time raises ``VipuUnreachable`` naming host:port; an
error the server reports comes back as the same exception type the
embedded service raises. Changes carry the server's token
(``Authorization: Bearer``) when the client has one. Proxies from the
environment are ignored: the V-IPU server is on the cluster's own network.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
from typing import Any, Optional
from urllib.parse import quote

from simipu.durations import check_seconds, shown
from simipu.fabric.join.addresses import host_port
from simipu.vipu.defaults import DEFAULT_PORT, DEFAULT_TIMEOUT
from simipu.vipu.errors import NotAVipuServer, VipuProtocolError, VipuUnreachable, error_from_kind
from simipu.vipu.lease import Lease
from simipu.vipu.models import Cluster, Partition, PartitionRequest, check_partition_name

MAX_REPLY_BYTES = 16 << 20
"""A reply larger than this is not a V-IPU server's (a partition list of a POD256 is a few hundred KiB)."""


def _complete(reply: bytearray) -> bool:
    """Whether ``reply`` holds its headers and the Content-Length they announce (else read to the close)."""
    head, found, body = bytes(reply).partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value)
    return False


def _may_be_http(reply: bytearray) -> bool:
    """Whether ``reply`` can still be an HTTP reply: its first bytes are (a prefix of) ``HTTP/``."""
    start = bytes(reply[:5])
    return b"HTTP/".startswith(start)


def _server_software(response: http.client.HTTPResponse) -> str:
    """``, Server: NAME`` as the reply says who answered (cut short, printable only), or nothing."""
    name = response.getheader("Server")
    if not name:
        return ""
    return ", Server: " + shown("".join(c if c.isprintable() else "?" for c in name))


class _Replayed(io.BytesIO):
    """The bytes of a whole reply, for ``http.client.HTTPResponse`` to parse (it reads a socket's file)."""

    def makefile(self, *args: object, **kwargs: object) -> _Replayed:
        return self


class VipuClient:
    """Talks to ``simipu vipu-server`` (or anything speaking its routes) at host:port."""

    def __init__(self, host: str, port: int = DEFAULT_PORT, timeout: float = DEFAULT_TIMEOUT,
                 token: Optional[str] = None) -> None:
        if not host:
            raise ValueError("VipuClient needs a host")
        if not 0 < port < 65536:
            raise ValueError(f"{port} is not a TCP port (1-65535)")
        try:
            check_seconds(timeout)  # nan, inf or 0 is no wait the OS can keep
        except ValueError as exc:
            raise ValueError(f"VipuClient timeout {exc}") from None
        self.host = host
        self.port = port
        self.timeout = timeout
        self._token = token
        self._netloc = host_port(host, port)

    def __repr__(self) -> str:
        return f"VipuClient({self.host!r}, port={self.port}, timeout={self.timeout:g})"

    def _request(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        headers = [f"{method} /v1{path} HTTP/1.0", f"Host: {self._netloc}", "Accept: application/json",
                   "Connection: close", f"Content-Length: {len(data)}"]
        if body is not None:
            headers.append("Content-Type: application/json")
        if self._token:
            headers.append(f"Authorization: Bearer {self._token}")
        message = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + data
        deadline = time.monotonic() + self.timeout
        try:
            raw = self._exchange(message, deadline)
            response = http.client.HTTPResponse(_Replayed(raw))  # type: ignore[arg-type]
            response.begin()
            status, payload = response.status, response.read()
        except (TimeoutError, OSError) as exc:
            raise VipuUnreachable(self.host, self.port, self._describe(exc)) from None
        except http.client.HTTPException as exc:
            raise NotAVipuServer(self.host, self.port, self._describe(exc)) from None
        answered = f"HTTP {status} for /v1{path}{_server_software(response)}"
        if status >= 400:
            raise self._server_error(payload, answered)
        try:
            reply = json.loads(payload)
        except ValueError:
            raise NotAVipuServer(self.host, self.port, f"{answered}, not JSON") from None
        if not isinstance(reply, dict):
            raise VipuProtocolError(f"the V-IPU server at {self._netloc} answered a JSON "
                                    f"{type(reply).__name__}, not the object of the V-IPU API")
        return reply

    def _exchange(self, message: bytes, deadline: float) -> bytes:
        """Send ``message`` and read until the server closes, all before ``deadline`` (else TimeoutError)."""
        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline passed")
            return left

        with socket.create_connection((self.host, self.port), timeout=remaining()) as sock:
            sock.settimeout(remaining())
            sock.sendall(message)
            reply = bytearray()
            while not _complete(reply):
                sock.settimeout(remaining())  # the whole reply within the deadline, however it trickles in
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
                if not _may_be_http(reply):  # a garbage status line: said now, not at the deadline
                    raise http.client.BadStatusLine(repr(shown(bytes(reply).partition(b"\r\n")[0].decode("latin-1"))))
                if len(reply) > MAX_REPLY_BYTES:
                    raise http.client.HTTPException(f"a reply of more than {MAX_REPLY_BYTES} bytes")
            return bytes(reply)

    def _describe(self, reason: object) -> str:
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"no answer within {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, socket.gaierror):
            return f"unknown host: {reason.strerror}"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror
        if isinstance(reason, http.client.HTTPException):
            return f"not an HTTP reply: {reason or type(reason).__name__}"
        return str(reason) or type(reason).__name__

    def _server_error(self, payload: bytes, answered: str) -> Exception:
        """The error the server reported, or, when the reply is not the V-IPU API's error, that it is not one."""
        try:
            error = json.loads(payload)["error"]
            return error_from_kind(str(error["kind"]), str(error["message"]))
        except (ValueError, KeyError, TypeError):
            return NotAVipuServer(self.host, self.port, answered)

    def _partition(self, reply: dict[str, Any]) -> Partition:
        if "partition" not in reply:
            raise VipuProtocolError(f"the V-IPU server at {self._netloc} sent no partition")
        return Partition.from_json(reply["partition"])

    @staticmethod
    def _path(name: str) -> str:
        return "/partitions/" + quote(check_partition_name(name), safe="")

    # -- VipuApi ---------------------------------------------------------

    def create_partition(self, request: PartitionRequest, holder: Optional[Lease] = None,
                         temporary: bool = False) -> Partition:
        body = {"request": request.to_json(), "holder": holder.to_json() if holder else None, "temporary": temporary}
        return self._partition(self._request("POST", "/partitions", body))

    def get_partition(self, name: str) -> Partition:
        return self._partition(self._request("GET", self._path(name)))

    def list_partitions(self) -> list[Partition]:
        listed = self._request("GET", "/partitions").get("partitions", [])
        if not isinstance(listed, list) or not all(isinstance(p, dict) for p in listed):
            raise VipuProtocolError(f"the V-IPU server at {self._netloc} listed its partitions as "
                                    f"{json.dumps(listed)[:80]}, not a list of JSON objects")
        return [Partition.from_json(p) for p in listed]

    def update_partition(self, name: str, request: PartitionRequest, holder: Optional[Lease] = None) -> Partition:
        body = {"request": request.to_json(), "holder": holder.to_json() if holder else None}
        return self._partition(self._request("PUT", self._path(name), body))

    def reset_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/reset", self._holder(holder)))

    def remove_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        return self._partition(self._request("DELETE", self._path(name), self._holder(holder)))

    def claim_partition(self, name: str, holder: Lease) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/claim", self._holder(holder)))

    def release_partition(self, name: str, holder: Lease) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/release", self._holder(holder)))

    def reclaim(self, lease: Lease) -> list[str]:
        removed = self._request("POST", "/leases/reclaim", {"lease": lease.to_json()}).get("removed", [])
        if not isinstance(removed, list) or not all(isinstance(n, str) for n in removed):
            raise VipuProtocolError(f"the V-IPU server at {self._netloc} sent a bad 'removed' list")
        return removed

    @staticmethod
    def _holder(holder: Optional[Lease]) -> dict[str, Any]:
        return {"holder": holder.to_json() if holder else None}

    def mark_failed(self, name: str) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/fail", {}))

    def cluster(self, name: Optional[str] = None) -> Cluster:
        if name is not None:
            return Cluster.from_json(self._request("GET", "/clusters/" + quote(name, safe="")).get("cluster") or {})
        reply = self._request("GET", "/clusters")
        for data in reply.get("clusters", []):
            cluster = Cluster.from_json(data)
            if cluster.name == reply.get("default"):
                return cluster
        raise VipuProtocolError(f"the V-IPU server at {self._netloc} named no default cluster")

    def list_clusters(self) -> list[Cluster]:
        return [Cluster.from_json(c) for c in self._request("GET", "/clusters").get("clusters", [])]
