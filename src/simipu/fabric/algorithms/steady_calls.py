"""The hot paths' entries for the world group's collectives through shared memory, once one ran.

A small collective of the whole job has a board plan (``board``,
``board_copies``), found by ``Fabric``'s hot paths and by
``popdist.collectives`` in the plans' dicts by its signature, with the
``out`` it was last checked with. A larger one, through shared memory, had
none: each call ran the engine's checks of its array, group and ``out``
and its plan lookups again before reaching the steady path
(``planned.PlannedPaths._copy_steady``, ``_whole_on_board``). A
``SteadyCall`` in the same dicts, made by the first such call, lets the
next ones skip those checks as a board plan's calls do.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def hot_pair(array: np.ndarray, out: np.ndarray | None, x: np.ndarray, result: np.ndarray) -> bool:
    """Whether a call the engine checked (``x``: ``array`` checked; ``result``: ``out`` if it is fit, with ``x``
    apart from it) leaves ``out`` and ``array`` fit for the next call's hot path, unchecked (``remember``)."""
    return out is not None and result is out and x is array and (out is x or not np.may_share_memory(out, x))


class SteadyCall:
    """A hot path's entry for one signature of the world group's collective through shared memory, made once
    the engine ran one (``planned.PlannedPaths._steady_whole``, ``_steady_copy``) and kept with the board plans,
    where the hot paths of ``Fabric`` and ``popdist.collectives`` find those: the engine's checks of the array,
    the group and ``out`` are made then and not again (an ``out`` is remembered with the array it was checked
    with, as a board plan's), and each call goes straight to ``run(x, out)``, which takes the steady path or
    else the general one. At N=4 on 2 CPUs the checks were about 10 us of a 256 KiB broadcast's 85 us per
    instance, two instances to a CPU."""

    #: As a board plan's (``BoardAllreduce``): the ``out`` last checked and the array it was checked with.
    checked_out: np.ndarray | None = None
    checked_for: np.ndarray | None = None

    def __init__(self, run: Callable[[np.ndarray, np.ndarray | None], np.ndarray]) -> None:
        self._run = run

    def remember(self, array: np.ndarray, out: np.ndarray | None, x: np.ndarray, result: np.ndarray) -> None:
        """As ``board_copies.BoardAllgather.remember``."""
        if hot_pair(array, out, x, result):
            self.checked_out, self.checked_for = out, x

    def allreduce(self, seq: int, x: np.ndarray, out: np.ndarray | None = None, payload: memoryview | None = None,
                  sources: tuple[np.ndarray, ...] = ()) -> np.ndarray:
        """The call, by a board plan's name for it (so that the hot paths call either alike): the result."""
        return self._run(x, out)
