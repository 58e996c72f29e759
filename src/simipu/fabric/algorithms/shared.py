"""Shared memory between the instances of one host, for large collectives.

Each instance owns one segment per group it reduces with through shared
memory (a *shared arena*): an anonymous ``memfd`` (named only in
/proc/<pid>/fd), mapped shared and grown with ``ftruncate`` when a larger
array comes. Its file descriptor goes to each same-host peer of the group
once, attached (SCM_RIGHTS) to the first shared-memory frame on the Unix
data link; the peer keeps it and maps it. There is never a name in /dev/shm,
so there is nothing to clean up: the kernel frees the memory when the last
process holding the descriptor or a mapping exits, SIGKILL included.

The allreduce over it, for a group whose members all share this host, in
one of two layouts (the frames are mailbox frames: no system call; the
phases are ``phases.Phase``'s, run through the engine as ``protocol.Phases``):

* *whole* (arrays up to ``WHOLE_BYTES``): each member copies its array into the
  slot of its segment this call's number picks (``slots_for``: two, or more
  for small arrays); SHARED_READY frames say "it is in place" (and carry the
  mismatch check); each member reduces the whole array reading every peer's
  copy in index order. One phase. A slot is written again two calls later at
  the earliest, after the next call's SHARED_READY showed that every peer has
  finished reading it.
* *chunked* (larger): each member copies into its segment the chunks the
  others own; SHARED_READY; member k reduces chunk k, reading every peer's
  segment in index order, straight into its own segment (where no peer reads
  its input); SHARED_REDUCED says "my chunk is reduced"; each member copies
  every chunk out into its result. Two phases: the next call of the same
  layout may write a segment at once, since its copy-in touches only the
  chunks the peers read before they said SHARED_REDUCED, and its reduction
  starts only after every peer's next SHARED_READY, sent once it had copied
  this call's chunks out. (A third phase, "I have finished reading", kept
  4 instances on 2 cores in step; the yield after each call does that now.)

When a call has another layout than the last (whole or chunked, size, item
size), its peers may still read what the last one left in the segments, so a
SHARED_DRAIN phase first makes every member wait until the others have
finished. Every member of a group runs the same calls, so all agree on when
that happens.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Callable, Sequence

import numpy as np

from ..errors import FabricError
from ..frames.link import Link
from .calls import EMPTY, Call, chunks, reduce_in_order
from .phases import Phase
from .protocol import Phases

#: Above this many bytes, an allreduce among instances of one host goes through shared memory.
SHARED_BYTES = 64 * 1024
#: The one-phase *whole* layout for arrays up to this size, else the *chunked* one. Measured on 2 cores when
#: chunked had three phases (per-instance medians, 4 instances): at 128 and 256 KiB whole took 134-223 us against
#: 166-300 chunked, at 512 KiB they were level, at 1 MiB whole took 554-658 us against 330-468; with 2 instances
#: the crossover was 256 KiB too. With two phases, chunked still took 1.5-3x whole's time at 256 KiB (N=2 and 4).
#: (Whole's work grows with the group, but with more instances than cores, each phase they all must reach costs
#: more than the reading.)
WHOLE_BYTES = 256 * 1024
#: Segments grow in steps of this many bytes.
GRANULE = 1 << 20
#: The *whole* layout and the broadcasts' and allgathers' (``shared_copies``) rotate through this many bytes of
#: slots, an array each (``slots_for``), so that by the time we write a slot again, the peers that read it have read
#: the others since and its lines have left their CPU's private cache (2 MiB of L2 here). Writing lines another
#: CPU's cache still holds waits for each to be taken back. Two processes pinned to the two CPUs here, one copying
#: 256 KiB into shared memory and the other copying it out in turn (2026-11-25): with the CPUs near, the copy in
#: took 28-40 us with one or two slots, 15 us with four, 7 us with eight or more; with the CPUs far apart, 116 us
#: with one slot and 27-35 us with 16 to 128 (the copy out took the same throughout). A larger ring helped larger
#: arrays with the CPUs far apart (2 MiB: 587 us to copy in with 8 MiB of slots, 373 us with 16 MiB) but made
#: 1 and 4 MiB broadcasts slower with them near (16 MiB: 45 and 170 us a call, against 33 and 126 us with 4 MiB),
#: and rotating the *chunked* layout's segment made its allreduce slower in both (4 MiB at N=2: 500 us against
#: 355 us): it writes and reads its whole segment each call, and a warm segment is worth more there.
RING_BYTES = 4 * 1024 * 1024
#: Arrays from this size keep two slots: at 1 MiB the ring's four took more time than they saved with the CPUs near
#: (the allgather of 4 MiB among 4 instances, a MiB from each: 844 us against 752 us, medians of three runs).
RING_BELOW = 1024 * 1024


def slots_for(nbytes: int) -> int:
    """How many slots of ``nbytes`` a layout rotates through, call by call: two, or for arrays under
    ``RING_BELOW`` enough to span ``RING_BYTES``. Every member of a group derives the same count from the same
    size."""
    return 2 if nbytes >= RING_BELOW else max(2, -(-RING_BYTES // max(1, nbytes)))


def ring_bytes(nbytes: int) -> int:
    """The bytes of a layout's slots of ``nbytes`` (``slots_for``): what a member that writes them reserves, and
    what a peer that reads them maps."""
    return slots_for(nbytes) * nbytes


_ANNOUNCEMENT = struct.Struct("<QQ")  # segment size, 1 if a descriptor is attached
ANNOUNCEMENT_BYTES = _ANNOUNCEMENT.size
#: The announcement of a segment as its peers mapped it: size 0 (``adopt`` maps or remaps only a larger one).
UNCHANGED = _ANNOUNCEMENT.pack(0, 0)


class _Segment:
    """A shared mapping of a memfd, remapped when the memfd grows."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = 0
        self._map: mmap.mmap | None = None
        self.array = np.empty(0, dtype=np.uint8)
        self.remap(size)

    def remap(self, size: int) -> None:
        self.unmap()
        self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.size = size

    def unmap(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes with it
            self._map = None

    def close(self) -> None:
        self.unmap()
        os.close(self.fd)


class SharedArena:
    """This instance's segment for one group, and the peers' segments for it that it has mapped."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._mine: _Segment | None = None
        self._peers: dict[int, _Segment] = {}
        self._fd_sent: set[int] = set()
        #: The last call's (layout, bytes, item size), and how many calls used the arena (their slots: ``slots_for``).
        self.layout: tuple[str, int, int] | None = None
        self.uses = 0
        #: Counts the (re)mappings of any segment here: views made before a change are made again.
        self.epoch = 0

    @staticmethod
    def available() -> bool:
        return hasattr(os, "memfd_create")

    def reserve(self, nbytes: int) -> np.ndarray:
        """My segment's first ``nbytes`` bytes, growing it if needed."""
        size = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        if self._mine is None:
            fd = os.memfd_create(self._label, os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            self._mine = _Segment(fd, size)
            self.epoch += 1
        elif self._mine.size < size:
            os.ftruncate(self._mine.fd, size)
            self._mine.remap(size)
            self.epoch += 1
        return self._mine.array[:nbytes]

    def announcement(self, peer: int) -> tuple[memoryview, tuple[int, ...]]:
        """The SHARED_READY payload for ``peer`` and the descriptors to attach (mine, the first time)."""
        assert self._mine is not None
        first = peer not in self._fd_sent
        self._fd_sent.add(peer)
        return memoryview(_ANNOUNCEMENT.pack(self._mine.size, int(first))), (self._mine.fd,) if first else ()

    def adopt(self, link: Link, payload: bytes | memoryview) -> None:
        """Map (or remap, if it grew) the segment ``link``'s peer announced."""
        size, attached = _ANNOUNCEMENT.unpack(payload)
        segment = self._peers.get(link.peer)
        if attached or segment is None or segment.size < size:
            self.epoch += 1
        if attached:
            if not link.fds:
                raise FabricError(f"instance {link.peer} announced a shared segment but no descriptor arrived")
            if segment is not None:
                segment.close()
            self._peers[link.peer] = _Segment(link.fds.popleft(), size)
        elif segment is None:
            raise FabricError(f"instance {link.peer} uses a shared segment this instance never received")
        elif segment.size < size:
            segment.remap(size)

    def peer(self, instance: int, nbytes: int) -> np.ndarray:
        return self._peers[instance].array[:nbytes]

    def steady_announcement(self, peers: Sequence[int]) -> bytes | None:
        """The SHARED_READY payload of a call that changes nothing (every segment mapped both ways), or None while
        some peer still lacks my segment or I theirs. It is ``UNCHANGED``, the same bytes on every member: with
        its own segment's size, a broadcast's root (whose segment holds the array twice) and its readers sent
        different frames, and the boards, which compare frames byte for byte, sent every such call the general
        way."""
        if self._mine is None or any(p not in self._fd_sent or p not in self._peers for p in peers):
            return None
        return UNCHANGED

    def close(self) -> None:
        for segment in [self._mine, *self._peers.values()]:
            if segment is not None:
                segment.close()
        self._mine = None
        self._peers.clear()
        self._fd_sent.clear()


def allreduce_shared(phases: Phases, arena: SharedArena, call: Call, x: np.ndarray,
                     ufunc: Callable[..., np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Allreduce through the members' shared segments (all on this host), into ``out`` (apart from ``x``) or a
    new array; see the module docstring."""
    g = call.group
    layout = ("whole" if x.nbytes <= WHOLE_BYTES else "chunked", x.nbytes, x.itemsize)
    if arena.layout is not None and arena.layout != layout:
        phases.run_all(call, Phase.SHARED_DRAIN, EMPTY, [None] * len(g.others))
    arena.layout = layout
    flat = x.reshape(-1)
    if layout[0] == "whole":
        n, slots = x.nbytes, slots_for(x.nbytes)
        slot = arena.uses % slots
        arena.uses += 1
        arena.reserve(slots * n)[slot * n:(slot + 1) * n] = flat.view(np.uint8)
        peers = _announce(phases, arena, call, slots * n)
        arrays = [flat if k == g.rank else peers[k][slot * n:(slot + 1) * n].view(x.dtype)
                  for k in range(len(g.members))]
        return reduce_in_order(ufunc, arrays, None if out is None else out.reshape(-1)).reshape(x.shape)
    spans = [slice(*span) for span in chunks(x.size, len(g.members))]
    segment = arena.reserve(x.nbytes).view(x.dtype)
    for k in g.others:
        segment[spans[k]] = flat[spans[k]]
    peers = {k: array.view(x.dtype) for k, array in _announce(phases, arena, call, x.nbytes).items()}
    mine = spans[g.rank]
    reduce_in_order(ufunc, [flat[mine] if k == g.rank else peers[k][mine] for k in range(len(g.members))],
                    segment[mine])
    phases.run_all(call, Phase.SHARED_REDUCED, EMPTY, [None] * len(g.others))
    result = np.empty_like(flat) if out is None else out.reshape(-1)
    result[mine] = segment[mine]
    for k in g.others:
        result[spans[k]] = peers[k][spans[k]]
    return result.reshape(x.shape)


def _announce(phases: Phases, arena: SharedArena, call: Call, nbytes: int) -> dict[int, np.ndarray]:
    """Phase SHARED_READY: tell every peer my segment is ready (its size; its descriptor the first time), map
    theirs."""
    g = call.group
    announcements = {k: arena.announcement(g.members[k]) for k in g.others}
    received = {k: bytearray(_ANNOUNCEMENT.size) for k in g.others}
    if any(fds for _, fds in announcements.values()):
        phases.run(call, Phase.SHARED_READY, {k: a[0] for k, a in announcements.items()},
                   {k: memoryview(b) for k, b in received.items()}, {k: a[1] for k, a in announcements.items() if a[1]})
    else:  # the usual call: the same bytes to every peer
        phases.run_all(call, Phase.SHARED_READY, announcements[g.others[0]][0],
                       [memoryview(received[k]) for k in g.others])
    for k in g.others:
        arena.adopt(g.links[k], received[k])  # type: ignore[arg-type]
    return {k: arena.peer(g.members[k], nbytes) for k in g.others}
