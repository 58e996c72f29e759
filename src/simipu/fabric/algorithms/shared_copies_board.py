"""A steady shared-memory broadcast or allgather of the whole job, its one phase published on the board.

``shared_copies`` runs SHARED_READY through the general ``run_all``; once a
call is like the last one (same kind, size and root, every segment mapped
both ways), that phase's frame is fixed but for its sequence number: the
steady announcement. This plan publishes it on this instance's board and
takes the peers' from theirs, as the small allreduce does
(``board.BoardAllreduce``, with the announcement as its ``tail``: exactly
the frames ``shared_copies`` would send, compared byte for byte), then
copies from the peers' segment halves as ``shared_copies`` does. If a
peer's frame is not there within the spin, or not as expected, nothing is
taken and the engine receives the frames the general way
(``planned.PlannedPaths._copy_fallback``).
"""

from __future__ import annotations

import numpy as np

from ..frames.header import ALLGATHER, BROADCAST, HeaderTemplate
from .board import SPREAD_SHARED, BoardAllreduce, BoardAllreduces
from .phases import Phase


class SharedCopyPlan(BoardAllreduce):
    """One signature (kind, root, dtype, shape) of the world group's shared-memory copy, at one arena epoch."""

    def __init__(self, boards: BoardAllreduces, like: np.ndarray, root_rank: int, tail: bytes) -> None:
        group = boards._group
        root = -1 if root_rank < 0 else group.members[root_rank]
        self._root_rank = root_rank
        template = HeaderTemplate(ALLGATHER if root_rank < 0 else BROADCAST, 0, Phase.SHARED_READY, like.dtype.str,
                                  tuple(like.shape), root, group.key, like.nbytes, tail)
        # (a template: ``reduce`` copies in place of the reduction, also in ``board.one_peer_call``)
        super().__init__(boards._segment, group, like, "sum", boards._spreader, Phase.SHARED_READY, tail,
                         template=template, hot=boards.hot, spread_every=SPREAD_SHARED)

    def reduce(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Every member's array into its row of ``out`` (an allgather), or the root's into ``out``."""
        assert out is not None
        if self._root_rank >= 0:
            root = arrays[self._root_rank]
            if root is not out:
                out.reshape(-1).view(np.uint8)[:] = root.reshape(-1).view(np.uint8)
            return out
        rows = out.reshape(len(arrays), -1).view(np.uint8)
        for k, array in enumerate(arrays):
            rows[k] = array.reshape(-1).view(np.uint8)
        return out
