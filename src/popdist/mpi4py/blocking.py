"""``Comm``'s blocking collectives: ``Barrier``, the Python objects' (``bcast``, ``allgather``, ``gather``,
``scatter``, ``allreduce``, ``reduce``) and the buffers' (``Bcast``, ``Allreduce``, ``Reduce``, ``Allgather``,
``Gather``, ``Scatter``), a mixin of ``comm.Comm`` as the others are (see its module docstring). Rooted
operations run as their all-to-all forms and keep the root's part.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from popdist.backend import current_fabric
from popdist.mpi4py.reductions import Op, alike, combiner, op_name, reduction
from popdist.mpi4py.specs import Datatype, buffer_of, fill, in_place, same_datatype, spec_datatype
from popdist.ragged import allgather_objects, broadcast_object


class BlockingCollectives:
    """``Comm``'s blocking collectives (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        def Get_size(self) -> int: ...
        def Get_rank(self) -> int: ...
        def _group(self) -> tuple[int, ...] | None: ...
        def _in_rank_order(self, gathered: Any) -> Any: ...
        def _root_instance(self, root: int, what: str) -> int: ...
        def _root_checked(self, root: int, what: str) -> int: ...
        def _is_agreed_root(self, root: int, what: str) -> bool: ...

    # -- synchronisation ----------------------------------------------------------------------------------
    def Barrier(self) -> None:
        current_fabric().barrier(self._group())

    barrier = Barrier

    # -- Python objects -----------------------------------------------------------------------------------
    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        return broadcast_object(obj, self._root_instance(root, "bcast"), self._group(), copied=True)

    def allgather(self, sendobj: Any) -> list[Any]:
        return self._in_rank_order(allgather_objects(sendobj, self._group(), copied=True))

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        root = self._root_checked(root, "gather")
        gathered = alike(self.allgather, "gather", sendobj, root=root)
        return gathered if self.Get_rank() == root else None

    def scatter(self, sendobj: Sequence[Any] | None = None, root: int = 0) -> Any:
        """Object k of the root's sequence to rank k. The root broadcasts them all, or why it cannot, so that a
        sequence of the wrong length raises on every rank, naming scatter."""
        root, size = self._root_checked(root, "scatter"), self.Get_size()
        problem, parts = None, None
        if self.Get_rank() == root:
            if not hasattr(sendobj, "__len__") or len(sendobj) != size:  # type: ignore[arg-type]
                given = "None" if sendobj is None else f"{len(sendobj)} objects" if hasattr(sendobj, "__len__") \
                    else f"a {type(sendobj).__name__}"
                problem = f"scatter: the root (rank {root}) gave {given}; it must give a sequence of {size}, one " \
                          "for each rank"
            else:
                parts = list(sendobj)  # type: ignore[arg-type]
        problem, parts = broadcast_object((problem, parts), self._root_instance(root, "scatter"), self._group(),
                                          copied=True)
        if problem is not None:
            raise ValueError(problem)
        return parts[self.Get_rank()]

    def allreduce(self, sendobj: Any, op: Op | None = None) -> Any:
        return functools.reduce(combiner(op, "allreduce"), alike(self.allgather, "allreduce", sendobj, op=op_name(op)))

    def reduce(self, sendobj: Any, op: Op | None = None, root: int = 0) -> Any:
        root = self._root_checked(root, "reduce")
        gathered = alike(self.allgather, "reduce", sendobj, op=op_name(op), root=root)
        result = functools.reduce(combiner(op, "reduce"), gathered)
        return result if self.Get_rank() == root else None

    # -- buffers ------------------------------------------------------------------------------------------
    def Bcast(self, buf: Any, root: int = 0) -> None:
        """The root's ``buf`` into every other rank's; the root only reads it (a read-only buffer there is fine,
        as in MPI)."""
        is_root = self.Get_rank() == root
        array = buffer_of(buf, "Bcast", receives=not is_root)
        received = current_fabric().broadcast(array, self._root_instance(root, "Bcast"), self._group())
        if not is_root:
            fill(array, received, "Bcast")

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None) -> None:
        recv = buffer_of(recvbuf, "Allreduce", receives=True)
        send = recv if in_place(sendbuf) else buffer_of(sendbuf, "Allreduce")
        same_datatype(send, recv, "Allreduce")
        fill(recv, self._reduced(send, op, "Allreduce", spec_datatype(recvbuf)), "Allreduce")

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op | None = None, root: int = 0) -> None:
        is_root = self._is_agreed_root(root, "Reduce")
        recv = buffer_of(recvbuf, "Reduce", receives=True) if is_root else None
        if in_place(sendbuf):
            if recv is None:
                raise ValueError("Reduce: only the root may pass MPI.IN_PLACE")
            send = recv
        else:
            send = buffer_of(sendbuf, "Reduce")
        if recv is not None:
            same_datatype(send, recv, "Reduce")
        result = self._reduced(send, op, "Reduce", spec_datatype(sendbuf) or spec_datatype(recvbuf))
        if recv is not None:
            fill(recv, result, "Reduce")

    def _reduced(self, send: np.ndarray, op: Op | None, what: str, datatype: Datatype | None = None) -> np.ndarray:
        """Every rank's ``send`` reduced with ``op``, in rank order: by the fabric's own reduction for the
        arithmetic operations, else from every rank's bytes, gathered (``reductions``; ``datatype``: what a
        user's function is told)."""
        operation = reduction(op, what)
        operation.check_buffer(send.dtype, what)
        if operation.fabric_op is not None:
            return current_fabric().allreduce(send, operation.fabric_op, self._group())
        rows = self._in_rank_order(current_fabric().allgather(send.view(np.uint8), self._group()))
        return operation.reduce_arrays([row.view(send.dtype) for row in rows], what, datatype)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        recv = buffer_of(recvbuf, "Allgather", receives=True, blocks=self.Get_size())
        send = self._own_block(recv, "Allgather") if in_place(sendbuf) else buffer_of(sendbuf, "Allgather")
        fill(recv, self._in_rank_order(current_fabric().allgather(send, self._group())), "Allgather")

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        is_root = self._is_agreed_root(root, "Gather")
        recv = buffer_of(recvbuf, "Gather", receives=True, blocks=self.Get_size()) if is_root else None
        if in_place(sendbuf):
            if recv is None:
                raise ValueError("Gather: only the root may pass MPI.IN_PLACE")
            send = self._own_block(recv, "Gather")
        else:
            send = buffer_of(sendbuf, "Gather")
        gathered = current_fabric().allgather(send, self._group())
        if recv is not None:
            fill(recv, self._in_rank_order(gathered), "Gather")

    def _own_block(self, recv: np.ndarray, what: str) -> np.ndarray:
        """With ``MPI.IN_PLACE``: this rank's block of the receive buffer, where MPI takes its contribution from."""
        size = self.Get_size()
        if recv.size % size:
            raise ValueError(f"{what}: the receive buffer's {recv.size} items do not split into {size} ranks' blocks")
        block = recv.size // size
        return recv[self.Get_rank() * block:(self.Get_rank() + 1) * block].copy()

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Block k of the root's ``sendbuf`` into rank k's ``recvbuf`` (the root's ``MPI.IN_PLACE``: its own
        block stays where it is). The root broadcasts every block and one row more, which says whether it refused
        its buffer, so that every rank then raises why (``_scatter_rows``), not only the root."""
        size, is_root = self.Get_size(), self.Get_rank() == self._root_checked(root, "Scatter")
        recv = None if is_root and in_place(recvbuf) else buffer_of(recvbuf, "Scatter", receives=True)
        problem = None
        if is_root:
            rows, problem = self._scatter_rows(sendbuf, recv)
        else:
            assert recv is not None
            rows = np.empty((size + 1, max(recv.size, 1)), recv.dtype)
        root_instance = self._root_instance(root, "Scatter")
        everything = current_fabric().broadcast(rows, root_instance, self._group())
        if everything[size].view(np.uint8).any():  # (the root refused its buffer: everyone learns why)
            raise ValueError(f"{broadcast_object(str(problem), root_instance, self._group())} (at the root, "
                             f"rank {root})")
        if recv is not None:
            fill(recv, everything[self.Get_rank(), :recv.size], "Scatter")

    def _scatter_rows(self, sendbuf: Any, recv: np.ndarray | None) -> tuple[np.ndarray, Exception | None]:
        """What ``Scatter``'s root broadcasts: a row for each rank's block (of ``recv``'s width, or, in place, the
        send buffer's share; at least one item wide), then a row that is zero; or, if the send buffer does not
        hold the blocks, rows whose last is not, and the error that says why."""
        size = self.Get_size()
        try:
            send = buffer_of(sendbuf, "Scatter", blocks=size)
        except ValueError as exc:
            if recv is None:
                raise  # (in place, the root cannot tell the others the shape they wait for)
            return self._refusal(recv.dtype, recv.size), exc
        block = send.size // size if recv is None else recv.size
        dtype = send.dtype if recv is None else recv.dtype
        if send.size != block * size:
            return self._refusal(dtype, block), ValueError(
                f"Scatter: the root's buffer holds {send.size} elements, {size} ranks x {block} are needed")
        rows = np.zeros((size + 1, max(block, 1)), dtype)
        rows[:size, :block] = send.reshape(size, block)
        return rows, None

    def _refusal(self, dtype: np.dtype, block: int) -> np.ndarray:
        """``_scatter_rows`` of a send buffer the root refuses: the shape the others wait for, the last row set."""
        rows = np.zeros((self.Get_size() + 1, max(block, 1)), dtype)
        rows[-1].view(np.uint8)[:] = 1
        return rows
