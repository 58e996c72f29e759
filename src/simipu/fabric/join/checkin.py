"""What the rendezvous accepts from a connection before it has authenticated, and its bounds.

Anyone who reaches the rendezvous port can connect, so everything a
connection sends before it has proved it knows the job's token is hostile
input: it is small (``MAX_CHECKIN_FRAME``), must come within
``CHECKIN_FRAME_DEADLINE`` seconds of connecting, and is parsed here into a
``CheckIn`` or refused with a ``Refused`` naming why. Nothing in it can raise
anything else, so a bad frame costs only its own connection (the fuzz test
in tests/test_rendezvous_hostile.py feeds it arbitrary bytes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .membership import Peer
from .messages import FrameReader, answer_is_right

#: The largest frame the rendezvous reads (a check-in is well under 1 KiB; after it come only heartbeats).
MAX_CHECKIN_FRAME = 8 * 1024
#: Seconds a new connection has to check in before the rendezvous closes it.
CHECKIN_FRAME_DEADLINE = 5.0
#: Connections awaiting authentication beyond the job's own instances; past that the oldest is closed.
SPARE_PENDING = 64


class Refused(ValueError):
    """A connection the rendezvous turns away; the message says why (logged, and sent back)."""


class CheckIn(NamedTuple):
    """An authenticated instance's announcement: who it is, and where its peers reach it. (A named tuple, not a
    frozen dataclass: made at every launch, its class is made about 6x faster.)"""

    peer: Peer

    @property
    def instance(self) -> int:
        return self.peer.instance


def checkin_reader() -> FrameReader:
    """The reader for a connection to the rendezvous: frames of at most ``MAX_CHECKIN_FRAME`` bytes."""
    return FrameReader(MAX_CHECKIN_FRAME)


def parse_checkin(message: dict[str, Any], token: bytes, nonce: bytes, num_instances: int) -> CheckIn:
    """Authenticate the first frame of a connection and check its announcement; ``Refused`` if either fails."""
    if not answer_is_right(token, nonce, message.get("auth")):
        raise Refused("it does not know this job's token")
    try:
        peer = Peer.from_wire(message.get("peer"))
    except ValueError as exc:
        raise Refused(f"its check-in is malformed: {exc}") from None
    claimed = message.get("num_instances")
    if claimed != num_instances or isinstance(claimed, bool) or not 0 <= peer.instance < num_instances:
        raise Refused(f"it claims instance {peer.instance} of {_short(claimed)}, but the job has {num_instances}")
    return CheckIn(peer)


def _short(value: object) -> str:
    """A received value for a log line: never more than a few dozen characters."""
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."

