"""``VipuClient``: the ``VipuApi`` over HTTP JSON to a V-IPU server (urllib, bounded waits).

Every request waits at most ``timeout`` seconds for each network step
(connect, each read). A server that refuses, does not resolve, or does not
answer in time raises ``VipuUnreachable`` naming host:port; an error the
server reports comes back as the same exception type the embedded service
raises. Proxies from the environment are ignored: the V-IPU server is on
the cluster's own network.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any, Optional
from urllib.parse import quote

from simipu.vipu.api import DEFAULT_PORT, DEFAULT_TIMEOUT
from simipu.vipu.errors import VipuProtocolError, VipuUnreachable, error_from_kind
from simipu.vipu.models import Cluster, Partition, PartitionRequest, check_partition_name

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class VipuClient:
    """Talks to ``simipu vipu-server`` (or anything speaking its routes) at host:port."""

    def __init__(self, host: str, port: int = DEFAULT_PORT, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not host:
            raise ValueError("VipuClient needs a host")
        if not 0 < port < 65536:
            raise ValueError(f"{port} is not a TCP port (1-65535)")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.host = host
        self.port = port
        self.timeout = timeout
        netloc = f"[{host}]" if ":" in host else host
        self._base = f"http://{netloc}:{port}/v1"

    def __repr__(self) -> str:
        return f"VipuClient({self.host!r}, port={self.port}, timeout={self.timeout:g})"

    def _request(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  "Accept": "application/json"})
        try:
            with _OPENER.open(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise self._server_error(exc.code, exc.read()) from None
        except urllib.error.URLError as exc:
            raise VipuUnreachable(self.host, self.port, self._describe(exc.reason)) from None
        except (TimeoutError, socket.timeout, ConnectionError, http.client.HTTPException) as exc:
            raise VipuUnreachable(self.host, self.port, self._describe(exc)) from None
        try:
            reply = json.loads(payload)
        except ValueError:
            raise VipuProtocolError(f"the V-IPU server at {self.host}:{self.port} did not answer JSON") from None
        if not isinstance(reply, dict):
            raise VipuProtocolError(f"the V-IPU server at {self.host}:{self.port} answered {type(reply).__name__}")
        return reply

    def _describe(self, reason: object) -> str:
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"no answer within {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, socket.gaierror):
            return f"unknown host: {reason.strerror}"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror
        return str(reason) or type(reason).__name__

    def _server_error(self, status: int, payload: bytes) -> Exception:
        try:
            error = json.loads(payload)["error"]
            return error_from_kind(str(error["kind"]), str(error["message"]))
        except (ValueError, KeyError, TypeError):
            return VipuProtocolError(f"the V-IPU server at {self.host}:{self.port} answered HTTP {status}")

    def _partition(self, reply: dict[str, Any]) -> Partition:
        if "partition" not in reply:
            raise VipuProtocolError(f"the V-IPU server at {self.host}:{self.port} sent no partition")
        return Partition.from_json(reply["partition"])

    @staticmethod
    def _path(name: str) -> str:
        return "/partitions/" + quote(check_partition_name(name), safe="")

    # -- VipuApi ---------------------------------------------------------

    def create_partition(self, request: PartitionRequest) -> Partition:
        return self._partition(self._request("POST", "/partitions", request.to_json()))

    def get_partition(self, name: str) -> Partition:
        return self._partition(self._request("GET", self._path(name)))

    def list_partitions(self) -> list[Partition]:
        reply = self._request("GET", "/partitions")
        return [Partition.from_json(p) for p in reply.get("partitions", [])]

    def update_partition(self, name: str, request: PartitionRequest) -> Partition:
        return self._partition(self._request("PUT", self._path(name), request.to_json()))

    def reset_partition(self, name: str) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/reset"))

    def remove_partition(self, name: str) -> Partition:
        return self._partition(self._request("DELETE", self._path(name)))

    def mark_failed(self, name: str) -> Partition:
        return self._partition(self._request("POST", self._path(name) + "/fail"))

    def cluster(self, name: Optional[str] = None) -> Cluster:
        if name is not None:
            return Cluster.from_json(self._request("GET", "/clusters/" + quote(name, safe="")).get("cluster"))
        reply = self._request("GET", "/clusters")
        for data in reply.get("clusters", []):
            cluster = Cluster.from_json(data)
            if cluster.name == reply.get("default"):
                return cluster
        raise VipuProtocolError(f"the V-IPU server at {self.host}:{self.port} named no default cluster")

    def list_clusters(self) -> list[Cluster]:
        return [Cluster.from_json(c) for c in self._request("GET", "/clusters").get("clusters", [])]
