"""The V-IPU HTTP JSON server: ``VipuApi`` over ``ThreadingHTTPServer`` (port 8090 by default).

Routes (all JSON):

    GET    /v1/clusters                   {"clusters": [...], "default": name}
    GET    /v1/clusters/<name>            {"cluster": {...}}
    GET    /v1/partitions                 {"partitions": [...]}
    POST   /v1/partitions                 {"request", "holder", "temporary"} -> 201 {"partition": {...}}
    GET    /v1/partitions/<name>          {"partition": {...}}
    PUT    /v1/partitions/<name>          {"request", "holder"} -> {"partition": {...}}
    DELETE /v1/partitions/<name>          {"holder"} -> {"partition": {...}} (as it was)
    POST   /v1/partitions/<name>/reset    {"holder"} -> {"partition": {...}}
    POST   /v1/partitions/<name>/claim    {"holder"} -> {"partition": {...}} (its IPUs held by holder)
    POST   /v1/partitions/<name>/release  {"holder"} -> {"partition": {...}}
    POST   /v1/partitions/<name>/fail     {"partition": {...}} (admin/test hook: PS_FAILED)
    POST   /v1/leases/reclaim             {"lease"} -> {"removed": [names]} (that process is gone)

Errors are ``{"error": {"kind": ..., "message": ...}}`` with the status of
the error type; the client turns the kind back into the same exception.

Reads (GET) are open; every change needs the server's token
(``Authorization: Bearer``, see ``simipu.vipu.token``), else 401.
Network input is hostile until then: each read waits at most
``io_timeout``, a whole connection lives at most ``request_deadline``, and
at most ``max_connections`` are open; at the cap, the connection that has
waited longest without sending a complete request is dropped for the new
one, so idle connections cannot lock out real requests.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import unquote

from simipu.durations import check_seconds, shown
from simipu.fabric.join.addresses import host_port, listen
from simipu.vipu.api import DEFAULT_PORT
from simipu.vipu.errors import InvalidPartitionRequest, VipuError, VipuProtocolError, VipuUnauthorized
from simipu.vipu.lease import Lease
from simipu.vipu.models import PartitionRequest
from simipu.vipu.service import VipuService

log = logging.getLogger("simipu.vipu.server")

MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerLimits:
    """How long and how many: what one client can cost the server."""

    io_timeout: float = 5.0
    """Seconds each read or write of a connection may wait."""
    request_deadline: float = 15.0
    """Seconds a whole connection (one request and its reply) may last."""
    max_connections: int = 64
    """Connections open at once; at the cap the longest-idle one is dropped for a new one."""

    def __post_init__(self) -> None:
        """Refuse a bound that is none: nan, inf and 1e400 would let one client hold a connection for ever."""
        for name in ("io_timeout", "request_deadline"):
            try:
                check_seconds(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"server limits: {name} {exc}") from None
        if self.max_connections < 1:
            raise ValueError(f"server limits: max_connections must be at least 1, got {self.max_connections}")


class _NoRoute(VipuProtocolError):
    http_status = 404


class _RequestTimeout(VipuProtocolError):
    http_status = 408


class _LengthRequired(InvalidPartitionRequest):
    http_status = 411


#: The methods of the routes above, said in ``Allow:`` when another is used.
ALLOWED_METHODS = "GET, POST, PUT, DELETE"


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    server_version = "simipu-vipu/1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.limits.io_timeout)  # each read and write of this connection

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.mark_busy(self.request)  # a complete request line and headers: no longer idle
        return parsed

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
            if method != "GET":
                self._authenticate()
            status, reply = self._route(method, [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")])
        except VipuError as exc:
            status, reply = exc.http_status, {"error": {"kind": exc.kind, "message": str(exc)}}
        except (TimeoutError, ConnectionError):
            status, reply = 408, {"error": {"kind": _RequestTimeout.kind,
                                            "message": "the request did not arrive whole in time"}}
        except Exception as exc:  # the server must answer, and say what broke
            log.exception("V-IPU server: %s %s failed", method, self.path)
            status = 500
            reply = {"error": {"kind": VipuProtocolError.kind,
                               "message": f"the V-IPU server failed on {method} {self.path}: {exc!r}"}}
        self._reply(status, reply)

    def _reply(self, status: int, reply: dict[str, Any], extra: Optional[dict[str, str]] = None) -> None:
        body = json.dumps(reply).encode()
        try:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                                **(extra or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client went away or stopped reading: nothing more to do for it
            self.close_connection = True

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """Python's own refusals (a malformed request line, a method with no route) in the JSON of every other
        error; a method the API does not have is 405 with ``Allow:``, not 501 with an HTML page."""
        extra = None
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            code, extra = HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": ALLOWED_METHODS}
            message = f"the V-IPU API has no method {shown(self.command)}; it takes {ALLOWED_METHODS}"
        self.close_connection = True
        self._reply(code, {"error": {"kind": VipuProtocolError.kind, "message": shown(message or explain or
                                                                                     HTTPStatus(code).phrase, 200)}},
                    extra)

    def _authenticate(self) -> None:
        expected = self.server.token
        if expected is None:
            return
        offered = self.headers.get("Authorization", "")
        scheme, _, token = offered.partition(" ")
        if scheme != "Bearer" or not hmac.compare_digest(token.strip().encode(errors="replace"), expected.encode()):
            peer = self.client_address[0]
            first = self.server.first_refusal(peer)  # once per peer: a flood of refusals must not flood the log
            log.log(logging.WARNING if first else logging.DEBUG, "V-IPU server: refused %s %s from %s: %s%s",
                    self.command, self.path, peer, "wrong token" if offered else "no token",
                    " (further refusals of this peer are logged at debug level)" if first else "")
            raise VipuUnauthorized(
                "changes need the V-IPU server's token: give the client the server's token file "
                "(SIMIPU_VIPU_TOKEN_FILE, default $XDG_STATE_HOME/poprun-py/vipu-server.token)"
            )

    def _body(self) -> dict[str, Any]:
        if "Transfer-Encoding" in self.headers:  # (its chunks were ignored, and the request read as empty)
            raise _LengthRequired("the V-IPU server takes a request body with Content-Length, not Transfer-Encoding")
        text = self.headers.get("Content-Length") or "0"
        if not (text.isascii() and text.isdigit()):  # (isdigit alone takes '²', which int() refuses)
            raise InvalidPartitionRequest(f"the request's Content-Length {text[:20]!r} is not a byte count")
        length = int(text)
        if length > MAX_BODY_BYTES:
            raise InvalidPartitionRequest(f"request body of {length} bytes is too large")
        data = self.rfile.read(length)
        if len(data) < length:
            raise _RequestTimeout(f"the request body ended after {len(data)} of {length} bytes")
        try:
            body = json.loads(data or b"{}")
        except ValueError:
            raise InvalidPartitionRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise InvalidPartitionRequest("the request body must be a JSON object")
        return body

    def _holder(self, body: dict[str, Any]) -> Optional[Lease]:
        return _lease(body["holder"]) if body.get("holder") is not None else None

    def _partition_request(self, body: dict[str, Any]) -> PartitionRequest:
        """The request under "request", or (the first wire format) the body itself."""
        if "request" in body:
            return PartitionRequest.from_json(body["request"])
        return PartitionRequest.from_json({k: v for k, v in body.items() if k not in ("holder", "temporary")})

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
                body = self._body()
                temporary = body.get("temporary", False)
                if not isinstance(temporary, bool):
                    raise InvalidPartitionRequest("'temporary' must be true or false")
                return 201, {"partition": service.create_partition(
                    self._partition_request(body), self._holder(body), temporary).to_json()}
        if rest == ["leases", "reclaim"] and method == "POST":
            return 200, {"removed": service.reclaim(_lease(self._body().get("lease")))}
        if len(rest) == 2 and rest[0] == "partitions":
            name = rest[1]
            actions: dict[str, Callable[[], Any]] = {
                "GET": lambda: service.get_partition(name),
                "PUT": lambda: (lambda body: service.update_partition(
                    name, self._partition_request(body), self._holder(body)))(self._body()),
                "DELETE": lambda: service.remove_partition(name, self._holder(self._body())),
            }
            if method in actions:
                return 200, {"partition": actions[method]().to_json()}
        if len(rest) == 3 and rest[0] == "partitions" and method == "POST":
            name, action = rest[1], rest[2]
            if action == "fail":
                return 200, {"partition": service.mark_failed(name).to_json()}
            holder = self._holder(self._body())
            if action == "reset":
                return 200, {"partition": service.reset_partition(name, holder).to_json()}
            if action in ("claim", "release"):
                if holder is None:
                    raise InvalidPartitionRequest(f"{action} needs the holder's lease")
                method_of = service.claim_partition if action == "claim" else service.release_partition
                return 200, {"partition": method_of(name, holder).to_json()}
        raise _NoRoute(f"no route {method} {self.path}")


def _lease(data: Any) -> Lease:
    """The lease a request body carries: one that is not a lease is the request's fault (400), not ours."""
    try:
        return Lease.from_json(data)
    except VipuProtocolError as exc:
        raise InvalidPartitionRequest(str(exc)) from None


class _Connection:
    """One accepted connection: dropped at its deadline, or earlier for a newer one if still idle."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.busy = False
        self.timer = threading.Timer(deadline, self.drop)
        self.timer.daemon = True

    def drop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # its reads and writes end at once; its thread finishes
        except OSError:
            pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    service: VipuService
    token: Optional[str]
    limits: ServerLimits

    def __init__(self, host: str, port: int, limits: ServerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}  # oldest first
        self._refused: set[str] = set()
        listener = listen(host, self.request_queue_size, port)  # IPv4 or IPv6, as the address is (the base: IPv4)
        self.address_family = listener.family
        super().__init__(listener.getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()  # the base class's unbound socket, of the default family
        self.socket = listener
        self.server_address = listener.getsockname()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._open) >= self.limits.max_connections:
                idle = next((c for c in self._open.values() if not c.busy), None)
                if idle is None:
                    log.warning("V-IPU server: %d requests in progress; refusing a connection from %s",
                                len(self._open), client_address[0])
                    self.shutdown_request(request)
                    return
                log.info("V-IPU server: at %d connections; dropping the longest idle one", len(self._open))
                del self._open[idle.sock]
                idle.timer.cancel()
                idle.drop()
            connection = _Connection(request, self.limits.request_deadline)
            self._open[request] = connection
        connection.timer.start()
        super().process_request(request, client_address)

    def first_refusal(self, peer: str) -> bool:
        """True the first time ``peer`` is refused (remembers at most 4096 peers)."""
        with self._lock:
            if peer in self._refused or len(self._refused) >= 4096:
                return False
            self._refused.add(peer)
            return True

    def mark_busy(self, request: Any) -> None:
        with self._lock:
            connection = self._open.get(request)
            if connection is not None:
                connection.busy = True

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            connection = self._open.pop(request, None)
        if connection is not None:
            connection.timer.cancel()
        super().shutdown_request(request)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class VipuServer:
    """Serves a ``VipuService`` over HTTP until shut down.

    Bind to port 0 to get a free port; ``address`` tells which. ``start()``
    runs it on a background thread (for tests and embedding);
    ``serve_forever()`` blocks (for ``simipu vipu-server``). With ``token``
    None, changes need no credential (only for embedding in a test).
    """

    def __init__(self, service: VipuService, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: Optional[str] = None, limits: ServerLimits = ServerLimits()) -> None:
        self.service = service
        self._httpd = _HttpServer(host, port, limits)
        self._httpd.service = service
        self._httpd.token = token
        self._thread: Optional[threading.Thread] = None
        if not _is_loopback(host):
            log.warning("V-IPU server: listening on %s, beyond this host: anyone who reaches port %d can read "
                        "the partitions; changes need the token%s", host, self.address[1],
                        "" if token else " (none is set: anyone can change them)")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        log.info("V-IPU server listening on %s (state %s)", host_port(*self.address), self.service.state_path)
        self._httpd.serve_forever(poll_interval=0.05)  # how soon shutdown() is noticed

    def start(self) -> VipuServer:
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

    def __enter__(self) -> VipuServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
