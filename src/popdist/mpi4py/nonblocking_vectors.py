"""The nonblocking vector collectives, ``Iallgatherv``, ``Igatherv``, ``Iscatterv`` and ``Ialltoallv``: each
rank's block of its own size at its own place (the specs of ``vectors.vector_of``), sent and received as the
other nonblocking collectives' parts are (``nonblocking``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.nonblocking import place_parts
from popdist.mpi4py.requests import Request
from popdist.mpi4py.specs import in_place
from popdist.mpi4py.vectors import vector_of


class NonblockingVectorCollectives:
    """``Comm``'s nonblocking vector collectives (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _root_checked(self, root: int, what: str) -> int: ...
        def _started(self, what: str, root: int, sends: Sequence[np.ndarray | None], needs: Sequence[bool],
                     finish: Callable[[list[matching.Message]], None]) -> Request: ...
        def _gathered(self, what: str, root: int | None, blocks: list[np.ndarray], sendbuf: Any) -> Request: ...
        def _scattered(self, what: str, root: int, blocks: list[np.ndarray], recvbuf: Any) -> Request: ...

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:
        recv, places = vector_of(recvbuf, self.Get_size(), "Iallgatherv", receives=True)
        return self._gathered("Iallgatherv", None, [recv[place] for place in places], sendbuf)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        root = self._root_checked(root, "Igatherv")
        blocks: list[np.ndarray] = []
        if self.Get_rank() == root:
            recv, places = vector_of(recvbuf, self.Get_size(), "Igatherv", receives=True)
            blocks = [recv[place] for place in places]
        return self._gathered("Igatherv", root, blocks, sendbuf)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        root = self._root_checked(root, "Iscatterv")
        blocks: list[np.ndarray] = []
        if self.Get_rank() == root:
            send, places = vector_of(sendbuf, self.Get_size(), "Iscatterv")
            blocks = [send[place] for place in places]
        return self._scattered("Iscatterv", root, blocks, recvbuf)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:
        size, me = self.Get_size(), self.Get_rank()
        recv, receives = vector_of(recvbuf, size, "Ialltoallv", receives=True)
        send, sends = (recv.copy(), receives) if in_place(sendbuf) else vector_of(sendbuf, size, "Ialltoallv")
        rooms = [recv[place] for place in receives]
        mine = send[sends[me]].copy()  # (in place, the receive buffer's block is written before it is read)

        def finish(parts: list[matching.Message]) -> None:
            place_parts(rooms, parts, mine, me, "Ialltoallv")
        return self._started("Ialltoallv", -1,
                             [None if k == me else send[place].view(np.uint8) for k, place in enumerate(sends)],
                             [k != me for k in range(size)], finish)
