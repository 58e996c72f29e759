"""Keeping a host's instances spread over its CPUs when the host runs more instances than it has CPUs.

Four instances waiting on each other with ``sched_yield`` on two CPUs: the
scheduler often puts three of them on one CPU (a wake-up lands the woken next
to its waker), and its load balancer, which sees every CPU busy, takes 100 ms
or more to undo that. A small allreduce then costs 50-65 us instead of 25-30
(measured: see the README's benchmark). So now and then each instance writes
the CPU it is on into its mailbox header, reads where its peers said they
were, and if its CPU holds at least two more of the host's instances than the
least busy CPU it may use, and it is the last of them by position (so that
only one moves), it moves there: its affinity becomes that CPU alone, then
at once the mask it had. With a CPU for each instance the kernel may still
put two on one CPU while another process holds the other: a wait that finds
the peer it waits for on its own CPU applies the same rule (``beside``). That is a move, not a pin: the kernel may place it
anywhere in its mask afterwards, as before. ``sched_setaffinity(0, ...)``
applies to the calling thread only, the one that calls the collectives.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Callable, Collection, Iterable, Sequence

log = logging.getLogger(__name__)

#: Word offset, in a mailbox segment's header, of the CPU its instance last said it was on, plus one (0: unknown).
CPU = 1


def _thread_cpu_reader() -> Callable[[], int]:
    """The calling thread's CPU: glibc's ``sched_getcpu`` (a vDSO call), else /proc/thread-self/stat."""
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
        getcpu.restype, getcpu.argtypes = ctypes.c_int, []
        return getcpu
    except (OSError, AttributeError):
        def from_proc() -> int:
            with open("/proc/thread-self/stat", "rb") as stat:
                return int(stat.read().rsplit(b")", 1)[1].split()[36])  # field 39, "processor"
        return from_proc


_current_cpu = _thread_cpu_reader()


class Spreader:
    """One instance's part in keeping the host's instances one per CPU where they can be (module docstring)."""

    def __init__(self, mine: memoryview, position: int, peers: Sequence[tuple[int, memoryview]]) -> None:
        """``mine``: our segment's header words; ``peers``: each same-host peer's position and header words."""
        self._mine = mine
        self._position = position
        self._peers = tuple(peers)
        #: Whether this host runs more instances than this instance may use CPUs (only then is spreading needed).
        self.oversubscribed = len(self._peers) + 1 > len(os.sched_getaffinity(0))

    def spread(self) -> None:
        """Say where we are; move to the least busy CPU of our mask if ours is crowded and we are its last."""
        try:
            cpu = _current_cpu()
            mask = os.sched_getaffinity(0)
        except OSError:
            return
        self._mine[CPU] = cpu + 1
        peers = [(position, header[CPU] - 1) for position, header in self._peers]
        target = crowded_move(cpu, mask, self._position, peers)
        if target is None:
            return
        try:
            os.sched_setaffinity(0, {target})  # the move: the kernel migrates the calling thread now
            os.sched_setaffinity(0, mask)
        except OSError as exc:  # the mask changed under us (a cpuset): placement is only a hint
            log.debug("could not move to CPU %d: %s", target, exc)
            return
        self._mine[CPU] = target + 1

    def beside(self, peer: memoryview) -> bool:
        """Whether the peer whose header words are ``peer`` last said it was on our CPU, once we have said where
        we are and moved if ours is crowded and we are its last (``spread``). A wait calls it when a peer is late
        on a host with a CPU for each instance: the kernel may still have put us both on one CPU, beside another
        process on the other, and keep us there (its balancer sees two busy CPUs either way); the peer then runs
        only when we yield, and a call costs two of the wait's ``ALONE_SECONDS`` (measured: a 4 KiB allreduce of
        two instances beside one busy loop took 55-63 us a call at the median, and 4.5-7.7 us once the later
        instance moved away)."""
        cpu = _current_cpu() + 1
        if self._mine[CPU] != cpu:  # (stored only when it changed: a store takes the line from the peers that read it)
            self._mine[CPU] = cpu
        if peer[CPU] != cpu or not cpu:  # (0: sched_getcpu failed, and 0 is also a peer's "unknown")
            return False
        self.spread()
        return self._mine[CPU] == cpu


def crowded_move(cpu: int, mask: Collection[int], position: int,
                 peers: Iterable[tuple[int, int]]) -> int | None:
    """Where the instance at ``position`` on ``cpu`` should move, given its ``mask`` and each peer's
    (position, CPU or -1 if unknown): the least busy CPU of the mask (the lowest of equals) if ours holds two
    more of the host's instances than that one and no peer on it comes after us; else None."""
    if cpu not in mask:
        return None
    load = dict.fromkeys(mask, 0)
    load[cpu] = 1
    for peer_position, peer_cpu in peers:
        if peer_cpu in load:
            load[peer_cpu] += 1
            if peer_cpu == cpu and peer_position > position:
                return None  # a peer after us on this CPU moves, if one must
    target = min(sorted(load), key=load.__getitem__)
    return target if load[cpu] - load[target] >= 2 else None
