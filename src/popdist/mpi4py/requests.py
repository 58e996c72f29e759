"""``MPI.Request``: what ``isend``/``irecv`` (and ``Isend``/``Irecv``) return.

A send is on its way when ``isend`` returns (the fabric's standard send, which never waits for the
receiver: ``comm.py``), so its request is complete at once. A receive is posted when ``irecv`` returns and
matched, in post order, to the messages as they come (``matching``); ``Wait`` waits for its message,
``Test`` takes what has come without waiting. A completed request is then MPI's null request: waiting on it
again returns at once, with nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from popdist.mpi4py import matching
from popdist.mpi4py.specs import ANY_SOURCE, ANY_TAG, README_SECTION, UNDEFINED, NotProvidedError, Status


class Request:
    """One nonblocking operation. ``finish`` turns a receive's message into what ``wait`` returns (and fills
    an ``Irecv``'s buffer); ``rank_of`` names its source as a rank of the communicator."""

    def __init__(self, receive: matching.Receive | None = None,
                 finish: Callable[[matching.Message], Any] | None = None,
                 rank_of: Callable[[int], int] | None = None, what: str = "request") -> None:
        self._receive = receive
        self._finish = finish
        self._rank_of = rank_of
        self._what = what
        self._status = (ANY_SOURCE, ANY_TAG, 0)
        self._active = True  # (until waited for, or tested complete: then MPI's null request)

    def _done(self) -> bool:
        return self._receive is None or self._receive.message is not None

    def _completed(self, block: bool, status: Status | None) -> tuple[bool, Any]:
        """(done, the receive's value) once done, waiting for it with ``block``; fills ``status``."""
        value = None
        receive = self._receive
        if receive is not None:
            if receive.message is None and not matching.progress([receive], block, self._what):
                return False, None
            message = receive.message
            assert message is not None and self._rank_of is not None and self._finish is not None
            self._receive = None  # (null from now on: its message is handed over once)
            self._status = (self._rank_of(message.source), message.tag, message.data.size)
            value = self._finish(message)
        self._active = False
        if status is not None:
            status.source, status.tag, status.nbytes = self._status
        return True, value

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
        """Whether the request is complete, without completing it."""
        done = self._done()
        if done and status is not None and self._receive is None:
            status.source, status.tag, status.nbytes = self._status
        return done

    def Free(self) -> None:
        if self._receive is not None:
            raise NotProvidedError(f"Request.Free of {self._what} that has not completed is not provided by poprun-py's "
                                   f"mpi4py (its message would be taken and dropped): Wait for it first ({README_SECTION})")

    @classmethod
    def Waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> list[Any]:
        return [r.wait(None if statuses is None else statuses[k]) for k, r in enumerate(requests)]

    @classmethod
    def Testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> tuple[bool, list | None]:
        """All complete, with their values; or (False, None), every request left as it was (MPI's Testall)."""
        pending = [r._receive for r in requests if r._receive is not None]
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
        """(the position of a request that completes, its value); (``UNDEFINED``, None) if all are null."""
        active = [r for r in requests if r._active]
        if not active:
            return UNDEFINED, None
        if not any(r._done() for r in active):
            matching.progress([r._receive for r in active if r._receive is not None], True, "waitany")
        index = next(k for k, r in enumerate(requests) if r._active and r._done())
        return index, requests[index].wait(status)

    def __repr__(self) -> str:
        state = "complete" if self._receive is None else "pending"
        return f"<mpi4py.MPI.Request {self._what} {state} (poprun-py)>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.Request.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} for "
                               "the methods that are")


def completed(what: str) -> Request:
    """A request that is complete already (a send's)."""
    return Request(what=what)
