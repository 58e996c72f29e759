"""The collectives engine: rendezvous, transports within and between hosts, algorithms."""

from .errors import CollectiveMismatchError, FabricError, PeerLostError, RendezvousError, RendezvousTimeout
from .join.membership import Membership, Peer

__all__ = [
    "CollectiveMismatchError",
    "FabricError",
    "Membership",
    "Peer",
    "PeerLostError",
    "RendezvousError",
    "RendezvousTimeout",
]
