"""What an algorithm asks of the engine: the one phase protocol every algorithm runs over.

An algorithm (``sockets``, ``shared``, ``hierarchical``) is a function of a ``Phases``
object (``engine.Fabric`` is the one there is) and a ``calls.Call``: it moves
its frames only through ``run`` and ``run_all``, each one phase of the call
(``phases.Phase``). A protocol, so the algorithms import nothing of the
engine that calls them. (The shared segments they need come as arguments.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # (types only: the protocol needs nothing at run time)
    from .calls import Call, Group


class Phases(Protocol):
    """One phase of a call at a time: frames out to some ranks, frames in from some (see ``engine.Fabric``)."""

    def run(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
            destinations: Mapping[int, memoryview | None],
            fds: Mapping[int, Sequence[int]] | None = None) -> None:
        """A frame to each rank in ``payloads``, one from each rank in ``destinations`` (None: an empty one);
        ``fds``: descriptors to attach, by rank."""

    def run_all(self, call: Call, phase: int, payload: memoryview,
                destinations: Sequence[memoryview | None]) -> None:
        """``payload`` to every other member, a frame from each (``destinations`` in ``call.group.others``
        order): the cheaper phase (one board publication when the group is the whole job)."""

    def receive_into_scratch(self, call: Call, phase: int, payloads: Mapping[int, memoryview],
                             like: np.ndarray) -> dict[int, np.ndarray]:
        """``run`` receiving a ``like``-shaped array from every other member into reused scratch arrays."""

    def scratch_for(self, g: Group, like: np.ndarray) -> tuple[list[np.ndarray], list[memoryview]]:
        """A ``like``-shaped array per other member of ``g`` (``g.others`` order) and their bytes, reused
        across calls: the small allreduce's receive buffers."""
