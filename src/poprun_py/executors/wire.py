"""The agent protocol: framed messages over one byte stream (an SSH channel or srun's pipes).

A frame is a header (kind, instance, payload length) and then the payload:
raw bytes for output, JSON for everything else. Never pickle across hosts.
The decoder is fed bytes, so it is tested without processes or sockets.

Agent to launcher: HELLO, STARTED, STDOUT/STDERR, EXITED, READY (every
instance spawned), FAILED (the start failed). Launcher to agent: START (the
instances with their environment: config travels here, never in argv),
SIGNAL and KEEPALIVE (over SSH, every ServerAliveInterval: an agent that hears
nothing for the bound it carries stops its instances). End of stream means
the other side is gone.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

#: Bumped whenever a frame changes meaning; launcher and agent must agree.
PROTOCOL_VERSION = 2
HEADER = struct.Struct("!BiI")  # kind, instance (-1: none), payload length
#: What the agent writes before its first frame: whatever a login shell prints before it is skipped.
MAGIC = b"\0poprun-agent\0"
#: A frame larger than this is a corrupt stream, not a message (output comes in 256 KiB reads).
MAX_PAYLOAD = 256 * 1024 * 1024


class Kind(IntEnum):
    HELLO = 1
    START = 2
    STARTED = 3
    STDOUT = 4
    STDERR = 5
    EXITED = 6
    READY = 7
    FAILED = 8
    SIGNAL = 9
    KEEPALIVE = 10


class ProtocolError(Exception):
    """The stream does not hold frames: the other side is not a poprun agent of this protocol."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    instance: int
    payload: bytes

    def json(self) -> Any:
        return json.loads(self.payload)


def encode(kind: Kind, payload: bytes = b"", instance: int = -1) -> bytes:
    return HEADER.pack(kind, instance, len(payload)) + payload


def encode_json(kind: Kind, message: Any, instance: int = -1) -> bytes:
    return encode(kind, json.dumps(message, separators=(",", ":")).encode(), instance)


class FrameDecoder:
    """Turns a byte stream, fed in pieces of any size, into frames.

    With ``after_magic``, bytes before ``MAGIC`` (a login banner, a chatty
    ``.bashrc``) are skipped and kept in ``noise`` for the log.
    """

    def __init__(self, after_magic: bool = False) -> None:
        self._buffer = bytearray()
        self._seeking = after_magic
        self.noise = b""

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        if self._seeking:
            found = self._buffer.find(MAGIC)
            if found < 0:
                keep = len(MAGIC) - 1  # the magic may be split across reads
                self.noise = (self.noise + bytes(self._buffer[:-keep] if len(self._buffer) > keep else b""))[-4096:]
                del self._buffer[:max(0, len(self._buffer) - keep)]
                return []
            self.noise = (self.noise + bytes(self._buffer[:found]))[-4096:]
            del self._buffer[:found + len(MAGIC)]
            self._seeking = False
        frames = []
        while len(self._buffer) >= HEADER.size:
            kind, instance, length = HEADER.unpack_from(self._buffer)
            try:
                kind = Kind(kind)
            except ValueError:
                raise ProtocolError(f"unknown frame kind {kind} (is something printing to the agent's stdout?)") from None
            if length > MAX_PAYLOAD:
                raise ProtocolError(f"a frame of {length} bytes is too large")
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append(Frame(kind, instance, bytes(self._buffer[HEADER.size:end])))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame (non-zero at end of stream means it was cut off)."""
        return len(self._buffer)
