"""The agent protocol: framed messages over one byte stream (an SSH channel or srun's pipes).

A frame is a header (kind, instance, payload length) and then the payload:
raw bytes for output, JSON for everything else. Never pickle across hosts.
The codec and the reader are ``simipu.framing``'s, shared with the fabric's
rendezvous; the decoder is fed bytes, so it is tested without processes or
sockets.

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

from simipu.framing import FrameReader, dump_json, pack_frame

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


_KINDS = frozenset(Kind)

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
    return pack_frame(HEADER, payload, kind, instance)


def encode_json(kind: Kind, message: Any, instance: int = -1) -> bytes:
    return encode(kind, dump_json(message), instance)


def _known_kind(fields: tuple[Any, ...]) -> None:
    if fields[0] not in _KINDS:
        raise ProtocolError(f"unknown frame kind {fields[0]} (is something printing to the agent's stdout?)")


def _frame(fields: tuple[Any, ...], payload: bytes) -> Frame:
    return Frame(Kind(fields[0]), fields[1], payload)


class FrameDecoder(FrameReader[Frame]):
    """Turns a byte stream, fed in pieces of any size, into frames (``simipu.framing``'s reader).

    With ``after_magic``, bytes before ``MAGIC`` (a login banner, a chatty
    ``.bashrc``) are skipped and kept in ``noise`` for the log.
    """

    def __init__(self, after_magic: bool = False) -> None:
        super().__init__(HEADER, MAX_PAYLOAD, lambda length: ProtocolError(f"a frame of {length} bytes is too large"),
                         _frame, _known_kind)
        self._seeking = bytearray() if after_magic else None
        self.noise = b""

    def add(self, data: bytes) -> None:
        if self._seeking is None:
            return super().add(data)
        self._seeking += data
        found = self._seeking.find(MAGIC)
        if found < 0:
            keep = len(MAGIC) - 1  # the magic may be split across reads
            self.noise = (self.noise + bytes(self._seeking[:-keep] if len(self._seeking) > keep else b""))[-4096:]
            del self._seeking[:max(0, len(self._seeking) - keep)]
            return None
        self.noise = (self.noise + bytes(self._seeking[:found]))[-4096:]
        rest = bytes(self._seeking[found + len(MAGIC):])
        self._seeking = None
        return super().add(rest)

    @property
    def pending(self) -> int:
        return len(self._seeking) if self._seeking is not None else super().pending
