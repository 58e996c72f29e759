"""How a board plan waits for a peer's publication: read the word, and yield the CPU when the peer may need it.

With more instances than CPUs (``await_crowded``) every read is followed by a yield: the peer we wait for may
be waiting for our CPU. With a CPU for each instance (``alone_waiter``) a wait only reads for its first
``ALONE_SECONDS``, then yields between reads, and from the start if the peer last said it was on our CPU
(``placement.Spreader.beside``, which also moves the later of the two away). See ``board``'s module docstring.
"""

from __future__ import annotations

import os
import time
from typing import Callable

#: How long a wait for a peer's publication only reads the word before it yields between reads, when the host
#: has a CPU for each instance: a yield is a system call, and a frame that lands during one is seen a few hundred
#: nanoseconds late, a fifth of a small call; but a peer that shares our CPU anyway (another process holds the
#: other one, and the kernel put both instances here) runs only when we let it. Without yielding, each such wait
#: lasted the whole spin (200 us) or until the kernel's tick took the CPU from us: with a busy loop on the other
#: CPU of two, a 256 KiB allreduce of two instances took 90-390 us a call instead of 55-115 us.
ALONE_SECONDS = 20e-6


#: ``(words, at, wanted, spin, peer) -> bool``: whether ``words[at]`` (a peer's publication) becomes ``wanted``
#: within ``spin`` s; ``peer``: that peer's header words (where it says which CPU it is on).
Await = Callable[[memoryview, int, int, float, memoryview], bool]


def alone_waiter(beside: Callable[[memoryview], bool]) -> Await:
    """The wait with a CPU for each instance: it reads, and after ``ALONE_SECONDS`` yields between reads; from
    the start if the peer is on our CPU and we did not move away (``beside``: ``Spreader.beside``). Called only
    when the publication is not there yet."""

    def await_alone(words: memoryview, at: int, wanted: int, spin: float, peer: memoryview) -> bool:
        start = time.perf_counter()
        alone_until, deadline = start if beside(peer) else start + min(ALONE_SECONDS, spin), start + spin
        while words[at] != wanted:
            now = time.perf_counter()
            if now > alone_until:
                if now > deadline:
                    return False
                os.sched_yield()
        return True
    return await_alone


def await_crowded(words: memoryview, at: int, wanted: int, spin: float, peer: memoryview | None = None) -> bool:
    """The wait with more instances than CPUs: it yields between all reads (the peer we wait for may need our
    CPU)."""
    deadline = time.perf_counter() + spin
    while words[at] != wanted:
        if time.perf_counter() > deadline:
            return False
        os.sched_yield()
    return True
