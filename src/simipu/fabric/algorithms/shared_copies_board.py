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
from .calls import byte_rows, to_bytes
from .phases import Phase


class SharedCopyPlan(BoardAllreduce):
    """One signature (kind, root, dtype, shape) of the world group's shared-memory copy, at one arena epoch."""

    def __init__(self, boards: BoardAllreduces, like: np.ndarray, root_rank: int, tail: bytes) -> None:
        group = boards._group
        root = -1 if root_rank < 0 else group.members[root_rank]
        self._root_rank = root_rank
        #: The last ``out`` and its byte views, a row per member (a broadcast's: one): see ``_rows_of``.
        self._rows_for: np.ndarray | None = None
        self._rows: list[memoryview] = []
        template = HeaderTemplate(ALLGATHER if root_rank < 0 else BROADCAST, 0, Phase.SHARED_READY, like.dtype.str,
                                  tuple(like.shape), root, group.key, like.nbytes, tail)
        # (a template: ``reduce`` copies in place of the reduction, also in ``board.one_peer_call``)
        super().__init__(boards._segment, group, like, "sum", boards._spreader, Phase.SHARED_READY, tail,
                         template=template, hot=boards.hot, spread_every=SPREAD_SHARED)

    def reduce(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Every member's array into its row of ``out`` (an allgather), or the root's into ``out``: byte views'
        copies, ``out``'s and our array's kept from the last call."""
        assert out is not None
        rows = self._rows if out is self._rows_for else self._rows_of(out)
        rank = self._rank
        if self._root_rank >= 0:
            root = arrays[self._root_rank]
            if root is not out:
                rows[0][:] = self._own_bytes(root) if self._root_rank == rank else to_bytes(root)
            return out
        for k, (row, array) in enumerate(zip(rows, arrays)):
            row[:] = self._own_bytes(array) if k == rank else to_bytes(array)
        return out

    def _rows_of(self, out: np.ndarray) -> list[memoryview]:
        """``out``'s bytes, a view per member's row (a broadcast's: one), kept for the next call's ``out``."""
        self._rows_for, self._rows = out, byte_rows(out, 1 if self._root_rank >= 0 else out.shape[0])
        return self._rows

    def _own_bytes(self, x: np.ndarray) -> memoryview:
        """Our array's bytes, the view kept from the last call if it is the same array (``bytes_of``)."""
        return self._x_bytes if x is self._x else self.bytes_of(x)
