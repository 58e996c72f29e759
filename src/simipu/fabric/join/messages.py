"""Rendezvous frames: a 4-byte big-endian length, then a JSON object (never pickle).

The codec and the reader are ``simipu.framing``'s (shared with poprun's agent wire).

A reader refuses, as ``ValueError``, any frame longer than its limit and any
body that is not a JSON object, however it is broken (bad UTF-8, bad JSON,
nesting deep enough to exhaust the parser's recursion): the rendezvous reads
unauthenticated bytes with it, and one bad frame must cost only its own
connection.
"""

from __future__ import annotations

import struct
from typing import Any

from ... import framing

_LENGTH = struct.Struct("!I")
#: The largest frame a member accepts from the rendezvous (the peer table of a large job).
MAX_FRAME = 1 << 22
#: How often members send a heartbeat (more often for a heartbeat timeout under 4 s: see ``heartbeat_interval``).
HEARTBEAT_INTERVAL = 1.0
#: The "instance" number of the rendezvous itself in loss reports.
LAUNCHER = -1
#: Why an instance left the fabric cleanly (its goodbye's "why", relayed to the others by the rendezvous),
#: as a peer still waiting for it reports it: a code on the wire, the words here.
LEAVE_REASONS = {
    "finalized": "it called popdist.finalizeBackend(), so it takes no part in this collective",
    "exited": "its program ended (its fabric closed at exit) without this collective",
    "closed": "it closed its fabric connection, so it takes no part in this collective",
}


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """How often to beat so that a live member is never late: several beats fit in the timeout."""
    return min(HEARTBEAT_INTERVAL, heartbeat_timeout / 4)


def encode_frame(message: dict[str, Any]) -> bytes:
    return framing.pack_frame(_LENGTH, framing.dump_json(message))


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


class FrameReader(framing.FrameReader[dict[str, Any]]):
    """Cuts a byte stream into JSON frames of at most ``max_frame`` bytes; feedable from bytes, for both ends.

    ``add`` raises ValueError for a frame it refuses.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        super().__init__(_LENGTH, max_frame, lambda length: ValueError(
            f"a rendezvous frame of {length} bytes is larger than {max_frame}"), lambda _header, body: parse_body(body))


def parse_body(body: bytes) -> dict[str, Any]:
    """A frame's JSON object; ValueError for anything else."""
    return framing.parse_object(body, "a rendezvous frame")
