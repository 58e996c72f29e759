"""The V-IPU HTTP JSON server: ``VipuApi`` over ``ThreadingHTTPServer`` (port 8090 by default).

Routes (all JSON):

    GET    /v1/clusters                  {"clusters": [...], "default": name}
    GET    /v1/clusters/<name>           {"cluster": {...}}
    GET    /v1/partitions                {"partitions": [...]}
    POST   /v1/partitions                request -> 201 {"partition": {...}}
    GET    /v1/partitions/<name>         {"partition": {...}}
    PUT    /v1/partitions/<name>         request -> {"partition": {...}}
    DELETE /v1/partitions/<name>         {"partition": {...}} (as it was)
    POST   /v1/partitions/<name>/reset   {"partition": {...}}
    POST   /v1/partitions/<name>/fail    {"partition": {...}} (admin/test hook: PS_FAILED)

Errors are ``{"error": {"kind": ..., "message": ...}}`` with the status of
the error type; the client turns the kind back into the same exception.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import unquote

from simipu.vipu.api import DEFAULT_PORT
from simipu.vipu.errors import InvalidPartitionRequest, VipuError, VipuProtocolError
from simipu.vipu.models import PartitionRequest
from simipu.vipu.service import VipuService

log = logging.getLogger("simipu.vipu.server")

MAX_BODY_BYTES = 1 << 20


class _NoRoute(VipuProtocolError):
    http_status = 404


class _Handler(BaseHTTPRequestHandler):
    server: "_HttpServer"
    server_version = "simipu-vipu/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        try:
            status, reply = self._route(method, [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")])
        except VipuError as exc:
            status, reply = exc.http_status, {"error": {"kind": exc.kind, "message": str(exc)}}
        except Exception as exc:  # the server must answer, and say what broke
            log.exception("V-IPU server: %s %s failed", method, self.path)
            status = 500
            reply = {"error": {"kind": VipuProtocolError.kind,
                               "message": f"the V-IPU server failed on {method} {self.path}: {exc!r}"}}
        body = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _request_body(self) -> PartitionRequest:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise InvalidPartitionRequest("the request's Content-Length is not a number") from None
        if length > MAX_BODY_BYTES:
            raise InvalidPartitionRequest(f"request body of {length} bytes is too large")
        return PartitionRequest.from_json(self.rfile.read(length) or b"null")

    def _route(self, method: str, parts: list[str]) -> tuple[int, dict[str, Any]]:
        service = self.server.service
        if parts[:1] != ["v1"]:
            raise _NoRoute(f"no route {method} {self.path}; the V-IPU API lives under /v1/")
        rest = parts[1:]
        if rest == ["clusters"] and method == "GET":
            return 200, {"clusters": [c.to_json() for c in service.list_clusters()],
                         "default": service.cluster().name}
        if len(rest) == 2 and rest[0] == "clusters" and method == "GET":
            return 200, {"cluster": service.cluster(rest[1]).to_json()}
        if rest == ["partitions"]:
            if method == "GET":
                return 200, {"partitions": [p.to_json() for p in service.list_partitions()]}
            if method == "POST":
                return 201, {"partition": service.create_partition(self._request_body()).to_json()}
        if len(rest) == 2 and rest[0] == "partitions":
            name = rest[1]
            actions: dict[str, Callable[[], Any]] = {
                "GET": lambda: service.get_partition(name),
                "PUT": lambda: service.update_partition(name, self._request_body()),
                "DELETE": lambda: service.remove_partition(name),
            }
            if method in actions:
                return 200, {"partition": actions[method]().to_json()}
        if len(rest) == 3 and rest[0] == "partitions" and method == "POST":
            if rest[2] == "reset":
                return 200, {"partition": service.reset_partition(rest[1]).to_json()}
            if rest[2] == "fail":
                return 200, {"partition": service.mark_failed(rest[1]).to_json()}
        raise _NoRoute(f"no route {method} {self.path}")


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    service: VipuService


class VipuServer:
    """Serves a ``VipuService`` over HTTP until shut down.

    Bind to port 0 to get a free port; ``address`` tells which. ``start()``
    runs it on a background thread (for tests and embedding);
    ``serve_forever()`` blocks (for ``simipu vipu-server``).
    """

    def __init__(self, service: VipuService, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self.service = service
        self._httpd = _HttpServer((host, port), _Handler)
        self._httpd.service = service
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        log.info("V-IPU server listening on %s:%d (state %s)", *self.address, self.service.state_path)
        self._httpd.serve_forever(poll_interval=0.05)  # how soon shutdown() is noticed

    def start(self) -> "VipuServer":
        self._thread = threading.Thread(target=self.serve_forever, name="vipu-server", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving (waits for the serve loop, not for requests in flight) and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "VipuServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
