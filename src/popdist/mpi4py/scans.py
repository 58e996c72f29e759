"""The prefix reductions, ``scan``/``Scan`` (rank r gets the reduction of ranks 0 to r) and
``exscan``/``Exscan`` (of ranks 0 to r - 1; rank 0 gets nothing, its buffer left as it was, as MPI leaves it
undefined). Every rank's contribution is gathered, and each rank reduces its prefix in rank order, so the
bits are the same whatever the timing, as the other reductions'.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from popdist.backend import current_fabric
from popdist.mpi4py.reductions import Op, alike, combiner, op_name, reduction
from popdist.mpi4py.specs import buffer_of, fill, in_place, same_datatype, spec_datatype


class PrefixReductions:
    """``Comm``'s prefix reductions (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        def Get_rank(self) -> int: ...
        def _group(self) -> tuple[int, ...] | None: ...
        def _in_rank_order(self, gathered: Any) -> Any: ...
        def allgather(self, sendobj: Any) -> list[Any]: ...

    def scan(self, sendobj: Any, op: Op | None = None) -> Any:
        everyone = alike(self.allgather, "scan", sendobj, op=op_name(op))
        return functools.reduce(combiner(op, "scan"), everyone[:self.Get_rank() + 1])

    def exscan(self, sendobj: Any, op: Op | None = None) -> Any:
        everyone = alike(self.allgather, "exscan", sendobj, op=op_name(op))
        return functools.reduce(combiner(op, "exscan"), everyone[:self.Get_rank()]) if self.Get_rank() else None

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        self._prefix(sendbuf, recvbuf, op, self.Get_rank() + 1, "Scan")

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        self._prefix(sendbuf, recvbuf, op, self.Get_rank(), "Exscan")

    def _prefix(self, sendbuf: Any, recvbuf: Any, op: Op | None, ranks: int, what: str) -> None:
        """The reduction of the first ``ranks`` ranks' buffers into ``recvbuf`` (none: left as it was)."""
        recv = buffer_of(recvbuf, what, receives=True)
        send = recv.copy() if in_place(sendbuf) else buffer_of(sendbuf, what)
        same_datatype(send, recv, what)
        operation = reduction(op, what)
        operation.check_buffer(send.dtype, what)
        gathered = self._in_rank_order(current_fabric().allgather(send.view(np.uint8), self._group()))
        if ranks:
            fill(recv, operation.reduce_arrays([row.view(send.dtype) for row in gathered[:ranks]], what,
                                               spec_datatype(recvbuf)), what)
