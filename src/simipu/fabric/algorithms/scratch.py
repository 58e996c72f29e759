"""Receive buffers reused across calls: where the frames of the peers land before they are reduced.

A training step makes the same small collectives again and again, so the
arrays that receive the peers' frames (and their bytes, which the links write
into) are made once per peer, shape and dtype, and looked up once per call.
With more instances than cores each microsecond here costs every instance.
Each peer's buffer grows to the largest frame it has sent; both caches start
again beyond ``MAX_VIEWS`` entries (a program of ever new shapes).
"""

from __future__ import annotations

import numpy as np

from .calls import Group, to_bytes

#: Views (and sets of views) kept before the caches start again.
MAX_VIEWS = 64


class ScratchBuffers:
    """One reusable receive buffer per peer rank, viewed as the arrays each call receives."""

    def __init__(self) -> None:
        self._buffers: dict[int, np.ndarray] = {}
        self._views: dict[tuple[int, np.dtype, tuple[int, ...]], tuple[np.ndarray, memoryview]] = {}
        self._sets: dict[tuple[tuple[int, ...], np.dtype, tuple[int, ...]],
                         tuple[list[np.ndarray], list[memoryview]]] = {}

    def for_group(self, g: Group, like: np.ndarray) -> tuple[list[np.ndarray], list[memoryview]]:
        """A ``like``-shaped array per other member of ``g`` (in ``g.others`` order) and their bytes."""
        key = (g.members, like.dtype, like.shape)
        cached = self._sets.get(key)
        if cached is None:
            if len(self._sets) >= MAX_VIEWS:
                self._sets.clear()
            pairs = [self.for_rank(k, like) for k in g.others]
            cached = self._sets[key] = ([a for a, _ in pairs], [v for _, v in pairs])
        return cached

    def for_rank(self, rank: int, like: np.ndarray) -> tuple[np.ndarray, memoryview]:
        """A ``like``-shaped array (and its bytes) to receive rank ``rank``'s frame into."""
        key = (rank, like.dtype, like.shape)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        buffer = self._buffers.get(rank)
        if buffer is None or buffer.nbytes < like.nbytes:
            buffer = self._buffers[rank] = np.empty(max(like.nbytes, 64), dtype=np.uint8)
            self._views = {k: v for k, v in self._views.items() if k[0] != rank}
        if len(self._views) >= MAX_VIEWS:
            self._views.clear()
        array = buffer[:like.nbytes].view(like.dtype).reshape(like.shape)
        cached = self._views[key] = (array, to_bytes(array))
        return cached

    def clear(self) -> None:
        self._buffers.clear()
        self._views.clear()
        self._sets.clear()
