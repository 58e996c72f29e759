"""Rendezvous frames: a 4-byte big-endian length, then a JSON object (never pickle)."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections import deque
from typing import Any

_LENGTH = struct.Struct("!I")
MAX_FRAME = 1 << 22
#: How often members send a heartbeat; the server's heartbeat timeout must be several of these.
HEARTBEAT_INTERVAL = 1.0
#: The "instance" number of the rendezvous itself in loss reports.
LAUNCHER = -1


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def challenge_answer(token: bytes, nonce: bytes) -> str:
    return hmac.new(token, nonce, hashlib.sha256).hexdigest()


class FrameReader:
    """Cuts a byte stream into JSON frames; feedable from bytes, for both ends."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._ready: deque[dict[str, Any]] = deque()

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
        """Add bytes; whole frames become available to ``pop``."""
        self._buffer += data
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise ValueError(f"a rendezvous frame of {length} bytes is larger than {MAX_FRAME}")
            if len(self._buffer) < _LENGTH.size + length:
                break
            body = bytes(self._buffer[_LENGTH.size : _LENGTH.size + length])
            del self._buffer[: _LENGTH.size + length]
            message = json.loads(body)
            if not isinstance(message, dict):
                raise ValueError("a rendezvous frame is not a JSON object")
            self._ready.append(message)
