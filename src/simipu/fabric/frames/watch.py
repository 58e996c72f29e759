"""Turning the rendezvous' loss notices into PeerLostError for the collective that is waiting."""

from __future__ import annotations

import select
import time
from typing import Iterable, Protocol

from ..errors import PeerLostError


class Control(Protocol):
    """What a wait needs of the control channel (``member.ControlChannel``)."""

    wake_fd: int

    def lost(self) -> dict[int, str]: ...

    def left(self) -> dict[int, str]: ...

    def clear_wake(self) -> None: ...


class LossWatch:
    """The control channel's wake fd, polled by every wait, and the loss table behind it.

    Every loss makes the wake fd readable; a wait that wakes drains it first
    and then reads the table, so a loss that does not concern this wait (an
    instance outside the group) costs one wake-up, and the next loss wakes
    the next wait again: no periodic re-checks.
    """

    EXPLAIN_WAIT = 0.5

    def __init__(self, control: Control | None) -> None:
        self.control = control
        self.fd: int | None = control.wake_fd if control is not None else None

    def check(self, among: Iterable[int]) -> None:
        """Raise PeerLostError for the first lost instance of ``among`` (or the launcher)."""
        if self.control is None:
            return
        self.control.clear_wake()  # before reading the table: a loss from now on wakes the next poll
        among = set(among)
        for instance, reason in sorted(self.control.lost().items()):
            if instance < 0 or instance in among:
                raise PeerLostError(instance, reason)

    def explain(self, peer: int, reason: str, among: Iterable[int]) -> PeerLostError:
        """The loss to report when ``peer``'s connection closed: the first participant the rendezvous saw die,
        else why ``peer`` left (its goodbye, relayed: ``popdist.finalizeBackend()``, the end of its program).

        A survivor that raised and exited also closes its connections, so the
        EOF we saw may be a knock-on; the rendezvous hears of a real death at
        once, so wait up to ``EXPLAIN_WAIT`` seconds for its word before
        blaming ``peer`` itself.
        """
        if self.control is None or self.fd is None:
            return PeerLostError(peer, reason)
        deadline = time.monotonic() + self.EXPLAIN_WAIT
        while True:
            try:
                self.check(among)
            except PeerLostError as lost:
                return lost
            why = self.control.left().get(peer)
            if why is not None:
                return PeerLostError(peer, why)
            left = deadline - time.monotonic()
            if left <= 0:
                return PeerLostError(peer, reason)
            poller = select.poll()  # not select(): the fd may be above FD_SETSIZE (1024)
            poller.register(self.fd, select.POLLIN)
            poller.poll(left * 1000)


#: What a wait to read a socket polls for (a peer's close and errors included).
READ_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


class FdPoll:
    """A wait's poll over file descriptors that change from one round to the next, with the loss watch's wake fd
    always among them (not select(): an fd may be above FD_SETSIZE, 1024)."""

    def __init__(self, watch: LossWatch) -> None:
        self._poller = select.poll()
        self._registered: dict[int, int] = {}
        self._watch_fd = watch.fd

    def poll(self, wanted: dict[int, int]) -> list[tuple[int, int]]:
        """Block until one of ``wanted`` (fd: events) or the watch's fd is ready: (fd, events) of each."""
        if self._watch_fd is not None:
            wanted[self._watch_fd] = select.POLLIN
        for fd in [fd for fd in self._registered if fd not in wanted]:
            self._poller.unregister(fd)
            del self._registered[fd]
        for fd, mask in wanted.items():
            if self._registered.get(fd) != mask:
                self._poller.register(fd, mask)
                self._registered[fd] = mask
        return self._poller.poll()
