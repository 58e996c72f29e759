"""Rendezvous frames: a 4-byte big-endian length, then a JSON object (never pickle).

A reader refuses, as ``ValueError``, any frame longer than its limit and any
body that is not a JSON object, however it is broken (bad UTF-8, bad JSON,
nesting deep enough to exhaust the parser's recursion): the rendezvous reads
unauthenticated bytes with it, and one bad frame must cost only its own
connection.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from typing import Any

_LENGTH = struct.Struct("!I")
#: The largest frame a member accepts from the rendezvous (the peer table of a large job).
MAX_FRAME = 1 << 22
#: How often members send a heartbeat (more often for a heartbeat timeout under 4 s: see ``heartbeat_interval``).
HEARTBEAT_INTERVAL = 1.0
#: The "instance" number of the rendezvous itself in loss reports.
LAUNCHER = -1


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """How often to beat so that a live member is never late: several beats fit in the timeout."""
    return min(HEARTBEAT_INTERVAL, heartbeat_timeout / 4)


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def challenge_answer(token: bytes, nonce: bytes) -> str:
    import hashlib  # here, not at import: OpenSSL's loading (~2 ms) is then off a launch's start-up path
    import hmac

    return hmac.new(token, nonce, hashlib.sha256).hexdigest()


def answer_is_right(token: bytes, nonce: bytes, answer: object) -> bool:
    """Whether ``answer`` (as received: any JSON value) is the challenge's answer; compared in constant time."""
    if not isinstance(answer, str):
        return False
    import hmac  # loaded by challenge_answer just before: a dictionary lookup

    expected = challenge_answer(token, nonce).encode()
    return hmac.compare_digest(answer.encode("utf-8", "surrogatepass"), expected)


class FrameReader:
    """Cuts a byte stream into JSON frames of at most ``max_frame`` bytes; feedable from bytes, for both ends."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._ready: deque[dict[str, Any]] = deque()
        self._max_frame = max_frame

    def pop(self) -> dict[str, Any] | None:
        """The next whole frame already received, if any."""
        return self._ready.popleft() if self._ready else None

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes; return (and forget) every whole frame received so far."""
        self.add(data)
        frames = list(self._ready)
        self._ready.clear()
        return frames

    def add(self, data: bytes) -> None:
        """Add bytes; whole frames become available to ``pop``. Raises ValueError for a frame it refuses."""
        self._buffer += data
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > self._max_frame:
                raise ValueError(f"a rendezvous frame of {length} bytes is larger than {self._max_frame}")
            if len(self._buffer) < _LENGTH.size + length:
                break
            body = bytes(self._buffer[_LENGTH.size : _LENGTH.size + length])
            del self._buffer[: _LENGTH.size + length]
            self._ready.append(parse_body(body))


def parse_body(body: bytes) -> dict[str, Any]:
    """A frame's JSON object; ValueError for anything else."""
    try:
        message = json.loads(body)
    except RecursionError:
        raise ValueError("a rendezvous frame is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ValueError(f"a rendezvous frame is not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ValueError("a rendezvous frame is not a JSON object")
    return message
