"""The collectives engine: rendezvous, transports within and between hosts, algorithms.

Layers, by when they run (each imports only those below it, and ``errors``)::

    engine.py, planned.py,  the top: one instance's ``Fabric`` (its collectives; the paths of
    runner.py, connect.py   calls like earlier ones, ``planned.PlannedPaths``; the phases they
                            run, ``runner.PhaseRunner``) and how it is made
    algorithms/             a collective as phases: groups and calls, named phases, the
                            socket, shared-memory, hierarchical and board algorithms
    frames/                 one phase's frames: headers, links (socket + mailboxes), the wait loop
    join/                   set-up: rendezvous, check-in, control channel, membership

One collective, e.g. ``fabric.allreduce(x)`` (four files):

1. ``engine.py``: ``Fabric.allreduce`` checks ``x``, numbers the call on its
   group (``algorithms/calls.py``: ``Call``, ``Group``) and picks the
   algorithm, each a function of the engine as ``algorithms/protocol.py``'s
   ``Phases``: one round over the links (``algorithms/sockets.py``, also
   home of broadcast, allgather, reduce_scatter and barrier),
   ``algorithms/shared.py`` (``algorithms/shared_copies.py`` for a large
   broadcast or allgather, ``algorithms/cross_memory.py`` when it reads the
   peers' arrays in place) or ``algorithms/hierarchical.py``, or, for a
   small one when every instance is on this host, the board
   (``algorithms/board.py``; ``algorithms/board_copies.py`` for a small
   broadcast or allgather). Every algorithm moves its frames one phase
   at a time (``algorithms/phases.py`` names them) through ``run`` /
   ``run_all`` (``runner.py``: a failed phase breaks the fabric and tells the peers).
2. ``frames/exchange.py``: a phase: post a frame to each peer, take one
   from each, spin then sleep in ``poll`` until all have moved, or raise why
   they cannot (a lost peer, a mismatched header).
3. ``frames/link.py``: one peer's link: its socket and mailboxes, and the
   numbering of its frames that keeps them in order (the link alone changes
   it); ``post`` and ``take`` move one frame.
4. ``frames/header.py``: what a frame's header says (the call's signature),
   compared byte for byte by the receiver.

Set-up, once per instance (``connect.connect``, which ``popdist`` calls at
``init``): open listeners; ``join/member.py``'s ``join`` checks in over the
control channel with the rendezvous (``join/rendezvous.py``, a thread of
poprun; ``join/checkin.py`` checks each check-in, ``join/messages.py`` frames
the messages) and gets the ``join/membership.py`` peer table back; then
``connect.build_mesh`` opens an authenticated link to every peer and
``frames/mailbox.py``'s shared-memory mailboxes beside the same-host ones, and
hands them to ``engine.Fabric``. While collectives wait, ``frames/watch.py``
reads the losses the rendezvous reports.
"""

from .errors import (
    CollectiveMismatchError,
    FabricError,
    ForkedProcessError,
    PeerLostError,
    RendezvousError,
    RendezvousTimeout,
)
from .join.membership import Membership, Peer

__all__ = [
    "CollectiveMismatchError",
    "FabricError",
    "ForkedProcessError",
    "Membership",
    "Peer",
    "PeerLostError",
    "RendezvousError",
    "RendezvousTimeout",
]
