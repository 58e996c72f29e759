"""Length-prefixed frames and their JSON bodies: one codec and one reader for every byte stream of ours.

A frame is a fixed ``struct`` header whose last field is the payload's
length, then the payload. The fabric's rendezvous (``fabric.frames``: a
4-byte length, then a JSON object) and poprun's agent wire
(``poprun_py.executors.wire``: kind, instance, length) differ only in their
header, so both are read by ``FrameReader``, which refuses a length over its
limit before it buffers a byte of the payload: hostile input costs only its
own connection. Bodies are JSON, never pickle, written compact by
``dump_json`` and read by ``parse_object``, which turns every way a body can
be broken into one ``ValueError``. This module sits on the bottom floor so
that both ``simipu`` and ``poprun_py`` can use it.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
#: JSON without the spaces ``json.dumps`` puts after separators by default.
COMPACT = (",", ":")


def dump_json(message: Any, compact: bool = True) -> bytes:
    """A JSON body, compact unless a wire format fixed the default spacing long ago."""
    return json.dumps(message, separators=COMPACT if compact else None).encode()


def parse_object(body: bytes, what: str) -> dict[str, Any]:
    """A body's JSON object; ``ValueError`` naming ``what`` for bad UTF-8, bad JSON, deep nesting or a non-object."""
    try:
        message = json.loads(body)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ValueError(f"{what} is not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ValueError(f"{what} is not a JSON object")
    return message


def pack_frame(header: struct.Struct, payload: bytes, *fields: Any) -> bytes:
    """``header`` packed with ``fields`` and the payload's length, then the payload."""
    return header.pack(*fields, len(payload)) + payload


class FrameReader(Generic[T]):
    """Cuts a byte stream, fed in pieces of any size, into frames; ``decode`` makes each a value.

    ``check`` sees each header's fields as soon as they are in (and may raise);
    a payload longer than ``max_payload`` raises ``too_large(length)``.
    """

    def __init__(self, header: struct.Struct, max_payload: int, too_large: Callable[[int], Exception],
                 decode: Callable[[tuple[Any, ...], bytes], T],
                 check: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        self._header = header
        self._max_payload = max_payload
        self._too_large = too_large
        self._decode = decode
        self._check = check
        self._buffer = bytearray()
        self._ready: deque[T] = deque()

    def add(self, data: bytes) -> None:
        """Add bytes; whole frames become available to ``pop``."""
        self._buffer += data
        size = self._header.size
        while len(self._buffer) >= size:
            fields = self._header.unpack_from(self._buffer)
            if self._check is not None:
                self._check(fields)
            length = fields[-1]
            if length > self._max_payload:
                raise self._too_large(length)
            if len(self._buffer) < size + length:
                break
            payload = bytes(self._buffer[size:size + length])
            del self._buffer[:size + length]
            self._ready.append(self._decode(fields, payload))

    def pop(self) -> T | None:
        """The next whole frame already received, if any."""
        return self._ready.popleft() if self._ready else None

    def feed(self, data: bytes) -> list[T]:
        """Add bytes; return (and forget) every whole frame received so far."""
        self.add(data)
        frames = list(self._ready)
        self._ready.clear()
        return frames

    def next_frame(self, read: Callable[[], bytes]) -> T | None:
        """The next frame, calling ``read`` for more bytes until one is whole; None once ``read`` gives none."""
        while not self._ready:
            data = read()
            if not data:
                return None
            self.add(data)
        return self._ready.popleft()

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame (non-zero at end of stream means it was cut off)."""
        return len(self._buffer)
