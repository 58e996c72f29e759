"""What can go wrong in the fabric, as types a program can catch."""

from __future__ import annotations


class FabricError(RuntimeError):
    """A collective could not complete."""


class PeerLostError(FabricError):
    """A peer instance died, or its host went away, while others needed it."""

    def __init__(self, instance: int, reason: str) -> None:
        who = "the launcher" if instance < 0 else f"instance {instance}"
        super().__init__(f"{who} is gone: {reason}")
        self.instance = instance
        self.reason = reason


class CollectiveMismatchError(FabricError):
    """Instances called different collectives, or with arrays that do not match."""


class ForkedProcessError(FabricError):
    """A collective was called in a process forked from an instance: only the instance itself is a member of
    the job's fabric (as in MPI, a fork is not a rank), so the fork is refused at once, without asking the
    rendezvous (which would refuse a second check-in of the instance's index)."""


class RendezvousError(FabricError):
    """Joining the job's fabric failed (refused, unreachable, or timed out)."""


class RendezvousTimeout(RendezvousError):
    """Some instances did not check in within the start-up stage's time."""

    def __init__(self, message: str, missing: tuple[int, ...]) -> None:
        super().__init__(message)
        self.missing = missing
