"""``Reduce_scatter_block`` and ``Reduce_scatter`` (rank k gets block k of the reduction of every rank's
buffer), blocking and nonblocking (``Ireduce_scatter_block``, ``Ireduce_scatter``).

The blocking ones reduce the whole buffer, as ``Allreduce`` does (the fabric's reduction, the same bits on
every rank), and keep this rank's block: simpler, and on the fabric's fastest path. The nonblocking ones
send each rank its block of this rank's buffer as messages (``nonblocking``), and each rank reduces the
blocks it gets in rank order. Counts, ``MPI.IN_PLACE`` and their checks are mpi4py's: with ``IN_PLACE`` the
receive buffer holds the whole contribution, and this rank's block is written at its start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.nonblocking import reduced_parts
from popdist.mpi4py.reductions import Op, reduction
from popdist.mpi4py.requests import Request
from popdist.mpi4py.specs import Datatype, buffer_of, fill, in_place, is_int, same_datatype, spec_datatype


class ReduceScatter:
    """``Comm``'s reduce-scatters (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def allgather(self, sendobj: Any) -> list[Any]: ...
        def _reduced(self, send: np.ndarray, op: Op | None, what: str,
                     datatype: Datatype | None = None) -> np.ndarray: ...
        def _started(self, what: str, root: int, sends: Sequence[np.ndarray | None], needs: Sequence[bool],
                     finish: Callable[[list[matching.Message]], None]) -> Request: ...

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        send, recv, counts = self._block_parts(sendbuf, recvbuf, "Reduce_scatter_block")
        self._keep_block(self._reduced(send, op, "Reduce_scatter_block", spec_datatype(recvbuf)), recv, counts,
                         "Reduce_scatter_block")

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                       op: Op | None = None) -> None:
        send, recv, counts = self._vector_parts(sendbuf, recvbuf, recvcounts, "Reduce_scatter")
        self._keep_block(self._reduced(send, op, "Reduce_scatter", spec_datatype(recvbuf)), recv, counts,
                         "Reduce_scatter")

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> Request:
        send, recv, counts = self._block_parts(sendbuf, recvbuf, "Ireduce_scatter_block")
        return self._started_reduce_scatter(send, recv, counts, op, spec_datatype(recvbuf), "Ireduce_scatter_block")

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                        op: Op | None = None) -> Request:
        send, recv, counts = self._vector_parts(sendbuf, recvbuf, recvcounts, "Ireduce_scatter")
        return self._started_reduce_scatter(send, recv, counts, op, spec_datatype(recvbuf), "Ireduce_scatter")

    def _block_parts(self, sendbuf: Any, recvbuf: Any, what: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(this rank's whole contribution, where its block goes, every rank's block's items) for equal blocks."""
        size = self.Get_size()
        if in_place(sendbuf):  # (a count in the spec is one rank's block, as mpi4py reads it)
            whole = buffer_of(recvbuf, what, receives=True, blocks=size)
            if whole.size % size:
                raise ValueError(f"{what}: with MPI.IN_PLACE the receive buffer holds every rank's block, and its "
                                 f"{whole.size} items do not split into {size}")
            count = whole.size // size
            return whole.copy(), whole[:count], [count] * size
        recv = buffer_of(recvbuf, what, receives=True)
        send = buffer_of(sendbuf, what, blocks=size)
        same_datatype(send, recv, what)
        if send.size != recv.size * size:
            raise ValueError(f"{what}: the send buffer holds {send.size} items, {size} ranks x {recv.size} (the "
                             "receive buffer's) are needed")
        return send, recv, [recv.size] * size

    def _vector_parts(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None,
                      what: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """``_block_parts`` for blocks of ``recvcounts`` items (None: each rank's receive buffer's, gathered)."""
        size, me = self.Get_size(), self.Get_rank()
        if recvcounts is None:
            if in_place(sendbuf):
                raise ValueError(f"{what}: with MPI.IN_PLACE give recvcounts (the receive buffer holds every "
                                 "rank's block, so its size does not say this rank's)")
            recv = buffer_of(recvbuf, what, receives=True)
            counts = [int(count) for count in self.allgather(recv.size)]
        else:
            counts = list(recvcounts)
            if len(counts) != size or not all(is_int(count) and count >= 0 for count in counts):
                raise ValueError(f"{what}: recvcounts {recvcounts!r} is not {size} ints from 0, one for each rank")
            counts = [int(count) for count in counts]
        total = sum(counts)
        if in_place(sendbuf):
            whole = buffer_of(recvbuf, what, receives=True)
            if whole.size != total:
                raise ValueError(f"{what}: with MPI.IN_PLACE the receive buffer holds every rank's block: "
                                 f"{total} items (the sum of recvcounts), not {whole.size}")
            return whole[:total].copy(), whole[:counts[me]], counts
        recv = buffer_of(recvbuf, what, receives=True)
        if recv.size != counts[me]:
            raise ValueError(f"{what}: the receive buffer holds {recv.size} items, recvcounts[{me}] is {counts[me]}")
        send = buffer_of(sendbuf, what)
        same_datatype(send, recv, what)
        if send.size != total:
            raise ValueError(f"{what}: the send buffer holds {send.size} items, the sum of recvcounts is {total}")
        return send, recv, counts

    def _keep_block(self, reduced: np.ndarray, recv: np.ndarray, counts: list[int], what: str) -> None:
        me = self.Get_rank()
        start = sum(counts[:me])
        fill(recv, reduced[start:start + counts[me]], what)

    def _started_reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int], op: Op | None,
                                datatype: Datatype | None, what: str) -> Request:
        """Each rank's block of ``send`` to it as a message; this rank's blocks, reduced in rank order, into
        ``recv`` once they have all come."""
        operation = reduction(op, what)
        operation.check_buffer(send.dtype, what)
        size, me = self.Get_size(), self.Get_rank()
        starts = np.cumsum([0, *counts])
        blocks = [send[starts[k]:starts[k + 1]] for k in range(size)]
        return self._started(what, -1, [None if k == me else block.view(np.uint8) for k, block in enumerate(blocks)],
                             [k != me for k in range(size)],
                             lambda parts: fill(recv, reduced_parts(parts, blocks[me], me, operation, what, datatype), what))
