"""Shared memory between the instances of one host, for large collectives.

Each instance owns one segment: an anonymous ``memfd`` (named
``poprun-<job_id>-<instance>`` only in /proc/<pid>/fd), mapped shared and
grown with ``ftruncate`` when a larger array comes. Its file descriptor goes
to each same-host peer once, attached (SCM_RIGHTS) to the first shared-memory
frame on the Unix data link; the peer keeps it and maps it. There is never a
name in /dev/shm, so there is nothing to clean up: the kernel frees the
memory when the last process holding the descriptor or a mapping exits,
SIGKILL included. (This is the "unlinked as soon as every peer has it"
design taken to its end: it is never linked.)

The allreduce over it, for a group whose members all share this host:

1. each member copies into its own segment the chunks the others own;
2. phase 1 frames (an empty-ish header, the segment's size, the fd the first
   time) say "my inputs are in place" and carry the mismatch check;
3. member k reduces chunk k reading every peer's segment directly, in index
   order, into its result, and copies it into its own segment;
4. phase 2 frames say "my reduced chunk is in place"; each member copies the
   other chunks from their owners' segments;
5. phase 3 frames say "I have finished reading", so segments can be reused.

Compared with sockets this moves each byte through memory about half as
often and makes no system call per block of data.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Callable, Mapping, Sequence

import numpy as np

from .errors import FabricError
from .transport import Link

#: Segments grow in steps of this many bytes.
GRANULE = 1 << 20
_ANNOUNCEMENT = struct.Struct("<QQ")  # segment size, 1 if a descriptor is attached


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
    """This instance's segment and the same-host peers' segments it has mapped."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._mine: _Segment | None = None
        self._peers: dict[int, _Segment] = {}
        self._fd_sent: set[int] = set()

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
        elif self._mine.size < size:
            os.ftruncate(self._mine.fd, size)
            self._mine.remap(size)
        return self._mine.array[:nbytes]

    def announcement(self, peer: int) -> tuple[memoryview, tuple[int, ...]]:
        """The phase-1 payload for ``peer`` and the descriptors to attach (mine, the first time)."""
        assert self._mine is not None
        first = peer not in self._fd_sent
        self._fd_sent.add(peer)
        return memoryview(_ANNOUNCEMENT.pack(self._mine.size, int(first))), (self._mine.fd,) if first else ()

    def adopt(self, link: Link, payload: bytes | memoryview) -> None:
        """Map (or remap, if it grew) the segment ``link``'s peer announced."""
        size, attached = _ANNOUNCEMENT.unpack(payload)
        segment = self._peers.get(link.peer)
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

    def close(self) -> None:
        for segment in [self._mine, *self._peers.values()]:
            if segment is not None:
                segment.close()
        self._mine = None
        self._peers.clear()
        self._fd_sent.clear()


#: (call, phase, payloads by rank, destinations by rank, descriptors by rank) -> None
Run = Callable[[object, int, Mapping[int, memoryview], Mapping[int, memoryview | None],
                Mapping[int, Sequence[int]]], None]


def allreduce_shared(run: Run, arena: SharedArena, call: object, members: tuple[int, ...], rank: int,
                     links: Sequence[Link | None], x: np.ndarray, ufunc: Callable[..., np.ndarray],
                     spans: list[tuple[int, int]]) -> np.ndarray:
    """Allreduce through the members' shared segments (all on this host); see the module docstring."""
    flat = x.reshape(-1)
    others = [k for k in range(len(members)) if k != rank]
    segment = arena.reserve(x.nbytes).view(x.dtype)
    for k in others:
        segment[slice(*spans[k])] = flat[slice(*spans[k])]
    announcements = {k: arena.announcement(members[k]) for k in others}
    received = {k: bytearray(_ANNOUNCEMENT.size) for k in others}
    run(call, 11, {k: a[0] for k, a in announcements.items()}, {k: memoryview(b) for k, b in received.items()},
        {k: a[1] for k, a in announcements.items() if a[1]})
    for k in others:
        arena.adopt(links[k], received[k])  # type: ignore[arg-type]
    peers = {k: arena.peer(members[k], x.nbytes).view(x.dtype) for k in others}
    mine = slice(*spans[rank])
    result = np.empty_like(flat)
    arrays = [flat[mine] if k == rank else peers[k][mine] for k in range(len(members))]
    out = result[mine]
    ufunc(arrays[0], arrays[1], out=out)
    for other in arrays[2:]:
        ufunc(out, other, out=out)
    segment[mine] = out
    run(call, 12, {k: memoryview(b"") for k in others}, {k: None for k in others}, {})
    for k in others:
        result[slice(*spans[k])] = peers[k][slice(*spans[k])]
    del peers, arrays, segment
    run(call, 13, {k: memoryview(b"") for k in others}, {k: None for k in others}, {})
    return result.reshape(x.shape)
