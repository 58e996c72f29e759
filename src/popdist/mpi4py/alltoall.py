"""``alltoall`` and ``Alltoall``: each rank's block for rank k travels as a message (``matching.all_to_all``)
in a context of the communicator's collectives: messages' contexts are from 0, so the user's never match these.
Equal blocks only (``Alltoallv`` is not provided)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.specs import IN_PLACE, NotProvidedError, buffer_of


class AllToAll:
    """``Comm``'s all-to-all (see the module docstring), and the exchange the vector collectives use too."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _context: int

        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """Item k of ``sendobj`` to rank k; item k of the result from rank k (collective)."""
        size = self.Get_size()
        if sendobj is None or len(sendobj) != size:
            raise ValueError(f"alltoall: every rank gives a sequence of {size} objects, one for each rank")
        received = self._all_to_all([matching.pickled(obj) for obj in sendobj], [None] * size, "alltoall")
        return [matching.unpickled(message) for message in received]

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block k of ``sendbuf`` (its items split into as many equal blocks as ranks) to rank k; rank k's block
        for us into block k of ``recvbuf`` (collective)."""
        if sendbuf is IN_PLACE:
            raise NotProvidedError("Alltoall with MPI.IN_PLACE is not provided by poprun-py's mpi4py: pass the "
                                   "send buffer and a receive buffer apart from it")
        size = self.Get_size()
        send = buffer_of(sendbuf, "Alltoall").view(np.uint8)
        recv = buffer_of(recvbuf, "Alltoall", receives=True).view(np.uint8)
        if send.size % size or recv.size != send.size:
            raise ValueError(f"Alltoall: the send buffer's {send.size} bytes must split into {size} equal blocks, "
                             f"and the receive buffer must hold as many ({recv.size})")
        block = send.size // size
        parts = [slice(k * block, (k + 1) * block) for k in range(size)]
        received = self._all_to_all([send[part] for part in parts], [recv[part] for part in parts], "Alltoall")
        for part, message in zip(parts, received):
            matching.deliver(recv[part], message, "Alltoall", 0)

    def _all_to_all(self, blocks: Sequence[np.ndarray], rooms: Sequence[np.ndarray | None],
                    what: str) -> list[matching.Message]:
        """``matching.all_to_all`` among this communicator's ranks, in a context of its collectives."""
        instances = [self._instance(k, what) for k in range(self.Get_size())]
        return matching.all_to_all(instances, self.Get_rank(), -2 - self._context, blocks, rooms, what)
