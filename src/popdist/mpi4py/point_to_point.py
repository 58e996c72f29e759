"""``Comm``'s point to point: ``send``/``recv`` (and ``Send``/``Recv``) are MPI's standard mode: ``send``
returns once its message is on the way (the fabric's ``send``, which takes the peer's messages while it waits
for room: so two ranks may both send before they receive, and a ring of sends completes), and a receive
(blocking, or posted by ``irecv``) is matched as MPI matches it, by source (or ``ANY_SOURCE``) and tag, in the
order receives were posted (``matching``). ``isend``'s request is complete at once (``requests``);
``issend``'s once the receiver has matched its message. ``Recv`` takes a message of at most its buffer's
bytes, as MPI does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from popdist.mpi4py import matching
from popdist.mpi4py.requests import Request, completed
from popdist.mpi4py.specs import (
    ANY_SOURCE,
    ANY_TAG,
    ERR_TAG,
    PROC_NULL,
    MPIException,
    Status,
    buffer_of,
    fill_status,
    is_int,
)

#: What a receive from ``PROC_NULL`` says in its status: no source, no tag, nothing.
FROM_NOWHERE = (PROC_NULL, ANY_TAG, 0)


class PointToPoint:
    """``Comm``'s messages (see the module docstring)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _context: int

        def Get_size(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _rank_of(self, instance: int) -> int: ...

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """MPI's standard send: returns once the message is on its way (see the module docstring)."""
        self._send_bytes(matching.pickled(obj), dest, tag, "send")

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:
        message = self._received(source, tag, "recv", status, scratch=True)
        return None if message is None else matching.unpickled(message)  # (before anything else may use the scratch)

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """``send``, returning its request: complete already, as the message is on its way."""
        self.send(obj, dest, tag)
        return completed("isend")

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """MPI's synchronous send: returns once a receive on ``dest`` has taken the message."""
        self.issend(obj, dest, tag).Wait()

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """``ssend``, returning its request: complete once a receive on ``dest`` has taken the message."""
        return self._synchronous(matching.pickled(obj), dest, tag, "issend")

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """A receive posted now; its request's ``wait`` returns the object."""
        return self._posted(source, tag, "irecv", matching.unpickled)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None) -> Any:
        self.send(sendobj, dest, sendtag)
        return self.recv(recvbuf, source, recvtag, status)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Wait until a message that ``recv(source, tag)`` would take has come (it stays for the receive)."""
        self._probed(source, tag, True, "probe", status)
        return True

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Whether a message that ``recv(source, tag)`` would take has come (it stays for the receive)."""
        return self._probed(source, tag, False, "iprobe", status)

    Probe, Iprobe = probe, iprobe

    def _send_bytes(self, data: np.ndarray, dest: int, tag: int, what: str) -> None:
        """A message to ``dest`` (``PROC_NULL``: nowhere, as MPI's)."""
        if dest != PROC_NULL:
            matching.send(data, self._context, _sent_tag(tag, what), self._instance(dest, what))

    def _synchronous(self, data: np.ndarray, dest: int, tag: int, what: str) -> Request:
        """A message to ``dest`` whose request completes once a receive there has matched it (MPI's
        synchronous mode: ``matching.send_synchronous``)."""
        tag = _sent_tag(tag, what)
        if dest == PROC_NULL:
            return completed(what)
        reply = matching.send_synchronous(data, self._context, tag, self._instance(dest, what))
        return Request(reply, lambda message: None, self._rank_of, what, sent=True)

    def _sources(self, source: int, tag: int, what: str) -> list[int]:
        """The instances a receive from ``source`` (a rank, ``ANY_SOURCE``, or ``PROC_NULL``: none) takes messages
        from."""
        if not is_int(tag) or (tag < 0 and tag != ANY_TAG) or tag > matching.TAG_UB:
            raise MPIException(ERR_TAG, f"{what}: tag {tag!r} is not a tag: an int from 0 to {matching.TAG_UB}, or "
                                        "MPI.ANY_TAG")
        if source == ANY_SOURCE:
            return [self._instance(rank, what) for rank in range(self.Get_size())]
        return [] if source == PROC_NULL else [self._instance(source, what)]

    def _received(self, source: int, tag: int, what: str, status: Status | None,
                  room: np.ndarray | None = None, scratch: bool = False) -> matching.Message | None:
        """The first message from ``source`` (or any rank) with ``tag`` (or any): one that came earlier and is
        unclaimed, or the next that comes, receives posted before this one matched first (``matching``). None
        from ``PROC_NULL``, at once."""
        sources = self._sources(source, tag, what)
        if not sources:
            fill_status(status, FROM_NOWHERE)
            return None
        receive = matching.post(self._context, sources, int(tag), room, scratch)
        try:
            matching.progress([receive], True, what)
        except BaseException:
            matching.withdraw(receive)
            raise
        message = receive.message
        assert message is not None
        fill_status(status, (self._rank_of(message.source), message.tag, message.data.size))
        return message

    def _posted(self, source: int, tag: int, what: str, finish: Callable[[matching.Message], Any],
                room: np.ndarray | None = None) -> Request:
        sources = self._sources(source, tag, what)
        if not sources:
            return completed(what, FROM_NOWHERE)
        return Request(matching.post(self._context, sources, int(tag), room), finish, self._rank_of, what)

    def _probed(self, source: int, tag: int, block: bool, what: str, status: Status | None) -> bool:
        sources = self._sources(source, tag, what)
        if not sources:
            fill_status(status, FROM_NOWHERE)
            return True
        message = matching.probe(self._context, sources, int(tag), block, what)
        if message is not None:
            fill_status(status, (self._rank_of(message.source), message.tag, message.data.size))
        return message is not None

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """``send``'s standard mode, of the buffer's bytes."""
        self._send_bytes(buffer_of(buf, "Send").view(np.uint8), dest, tag, "Send")

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        """The message's bytes into the start of ``buf``, which must have room for them (MPI_ERR_TRUNCATE)."""
        room = buffer_of(buf, "Recv", receives=True).view(np.uint8)
        message = self._received(source, tag, "Recv", status, room)
        if message is not None:
            matching.deliver(room, message, "Recv", self._rank_of(message.source))

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """``Send``, returning its request: complete already (the buffer's bytes are on their way)."""
        self.Send(buf, dest, tag)
        return completed("Isend")

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        """``ssend`` of the buffer's bytes."""
        self.Issend(buf, dest, tag).Wait()

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """``issend`` of the buffer's bytes (read as it lies when called: it is on its way then)."""
        return self._synchronous(buffer_of(buf, "Issend").view(np.uint8), dest, tag, "Issend")

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """A receive posted now into ``buf``, filled when its request completes."""
        room = buffer_of(buf, "Irecv", receives=True).view(np.uint8)
        return self._posted(source, tag, "Irecv",
                            lambda message: matching.deliver(room, message, "Irecv", self._rank_of(message.source)), room)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        self.Send(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag, status)


def _sent_tag(tag: Any, what: str) -> int:
    """A send's tag, checked: an int from 0 to ``TAG_UB``."""
    if not is_int(tag) or not 0 <= tag <= matching.TAG_UB:
        raise MPIException(ERR_TAG, f"{what}: tag {tag!r} is not a tag: a message's tag is an int from 0 to "
                                    f"{matching.TAG_UB}")
    return int(tag)
