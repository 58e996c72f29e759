"""``MPI.Request``: what ``isend``/``irecv``/``issend`` (and ``Isend``/``Irecv``/``Issend``) return.

A send is on its way when ``isend`` returns (the fabric's standard send: ``comm.py``), so its request is
complete at once; a synchronous send's completes when the receiver's reply comes (``matching``). A receive
is posted when ``irecv`` returns and matched, in post order, to the messages as they come (``matching``);
``Wait`` waits for its message, ``Test`` takes what has come without waiting.
A request that has completed (or whose completion raised) is then MPI's null request: false, equal to
``REQUEST_NULL``, and waiting on it again returns at once with an empty status.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from popdist.mpi4py import matching
from popdist.mpi4py.specs import (
    EMPTY_STATUS,
    ERR_IN_STATUS,
    README_SECTION,
    UNDEFINED,
    MPIException,
    NamesWhatIsNotProvided,
    NotProvidedError,
    Status,
    fill_status,
)


class Request(metaclass=NamesWhatIsNotProvided):
    """One nonblocking operation. ``finish`` turns a receive's message into what ``wait`` returns (and fills
    an ``Irecv``'s buffer); ``rank_of`` names its source as a rank of the communicator; ``status`` is a
    completed request's (a send's, or a receive from ``PROC_NULL``)."""

    def __init__(self, receive: matching.Receive | None = None,
                 finish: Callable[[matching.Message], Any] | None = None,
                 rank_of: Callable[[int], int] | None = None, what: str = "request",
                 status: tuple[int, int, int] = EMPTY_STATUS, active: bool = True, sent: bool = False) -> None:
        self._receive = receive
        self._sent = sent  # (a synchronous send's: ``receive`` takes the reply; its status says nothing)
        self._finish = finish
        self._rank_of = rank_of
        self._what = what
        self._status = status
        self._active = active  # (until waited for, or tested complete: then MPI's null request)
        self._outcome: tuple[Any] | None = None  # (``finish``'s value, once it has run: ``_finished``)

    def _done(self) -> bool:
        return self._receive is None or self._receive.message is not None

    def _pending(self) -> list[matching.Receive]:
        """The receives whose messages it still waits for."""
        return [self._receive] if self._receive is not None and self._receive.message is None else []

    def _completed(self, block: bool, status: Status | None) -> tuple[bool, Any]:
        """(done, the receive's value) once done, waiting for it with ``block``; fills ``status``. An inactive
        (null) request is done, with nothing."""
        if not self._active:
            fill_status(status, EMPTY_STATUS)
            return True, None
        receive = self._receive
        if receive is not None:
            if receive.message is None and not matching.progress([receive], block, self._what):
                return False, None
            message = receive.message
            assert message is not None and self._finish is not None
            self._receive, self._active = None, False  # (null from now on, even if ``finish`` raises)
            self._status = self._fields_of(message)
            fill_status(status, self._status)
            return True, self._finished(message)
        self._active = False
        fill_status(status, self._status)
        return True, None

    def _finished(self, message: matching.Message) -> Any:
        """``finish``'s value for the matched ``message``, worked out once: ``Get_status`` fills the buffer as
        soon as it says complete, as MPI's, and ``Wait`` then returns the same value."""
        if self._outcome is None:
            assert self._finish is not None
            self._outcome = (self._finish(message),)
        return self._outcome[0]

    def Wait(self, status: Status | None = None) -> bool:
        self._completed(True, status)
        return True

    def wait(self, status: Status | None = None) -> Any:
        return self._completed(True, status)[1]

    def Test(self, status: Status | None = None) -> bool:
        return self._completed(False, status)[0]

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        return self._completed(False, status)

    def Get_status(self, status: Status | None = None) -> bool:
        """Whether the request is complete (taking the messages that have come), without completing it; if it
        is, ``status`` says what came."""
        if not self._active:
            fill_status(status, EMPTY_STATUS)
            return True
        receive = self._receive
        if receive is not None and receive.message is None and not matching.progress([receive], False, self._what):
            return False
        message = None if receive is None else receive.message
        if message is not None:
            self._finished(message)
        fill_status(status, self._status if message is None else self._fields_of(message))
        return True

    def _fields_of(self, message: matching.Message) -> tuple[int, int, int]:
        """What a status says of ``message``: its source as a rank of the communicator, its tag, its bytes
        (nothing, for a synchronous send's reply, as MPI's status of a send)."""
        if self._sent:
            return EMPTY_STATUS
        assert self._rank_of is not None, "a receive's request"
        return self._rank_of(message.source), message.tag, message.data.size

    get_status = Get_status

    def Free(self) -> None:
        if self._receive is not None:
            raise NotProvidedError(f"Request.Free of {self._what} that has not completed is not provided by poprun-py's "
                                   f"mpi4py (its message would be taken and dropped): Wait for it first ({README_SECTION})")
        self._active = False

    def __bool__(self) -> bool:
        return self._active

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or not (self._active or other._active)

    __hash__ = None  # type: ignore[assignment]  # (as mpi4py's: equality follows the handle, which changes)

    @classmethod
    def Waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> list[Any]:
        """Every request completed, in order, with their values. If any failed (a receive's message was larger
        than its buffer), the rest still complete, and then ``MPI.Exception`` with ``ERR_IN_STATUS`` says which,
        each failed request's status having its error class (as MPI's Waitall)."""
        values: list[Any] = []
        failed: list[tuple[int, MPIException]] = []
        for k, request in enumerate(requests):
            status = None if statuses is None else statuses[k]
            try:
                values.append(request.wait(status))
            except MPIException as exc:
                values.append(None)
                failed.append((k, exc))
                if status is not None:
                    status.error = exc.error_code
        if failed:
            first, error = failed[0]
            raise MPIException(ERR_IN_STATUS, f"Waitall: {len(failed)} of {len(requests)} requests failed; request "
                               f"{first}: {error}") from error
        return values

    @classmethod
    def Testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> tuple[bool, list | None]:
        """All complete, with their values; or (False, None), every request left as it was (MPI's Testall)."""
        pending = [receive for r in requests if r._active for receive in r._pending()]
        for receive in pending:  # (take what has come for each, completing none yet)
            if receive.message is None:
                matching.progress([receive], False, "testall")
        if any(receive.message is None for receive in pending):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests: Sequence[Request], status: Status | None = None) -> int:
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        """(the position of a request that completes, its value); (``UNDEFINED``, None) with an empty status if
        all are null."""
        active = [r for r in requests if r._active]
        if not active:
            fill_status(status, EMPTY_STATUS)
            return UNDEFINED, None
        while not any(r._done() for r in active):  # (a collective's request is done when all its parts are)
            matching.progress([receive for r in active for receive in r._pending()], True, "waitany")
        index = next(k for k, r in enumerate(requests) if r._active and r._done())
        return index, requests[index].wait(status)

    def __repr__(self) -> str:
        state = "null" if not self._active else "complete" if self._done() else "pending"
        return f"<mpi4py.MPI.Request {self._what} {state} (poprun-py)>"

    def __getattr__(self, name: str) -> Any:
        return getattr(type(self), name)  # (``_NotProvided``: the error that names it)


def completed(what: str, status: tuple[int, int, int] = EMPTY_STATUS) -> Request:
    """A request that is complete already (a send's, a receive's from ``PROC_NULL``)."""
    return Request(what=what, status=status)


#: MPI's null request: what a completed request becomes (``MPI.REQUEST_NULL``).
REQUEST_NULL = Request(what="REQUEST_NULL", active=False)
