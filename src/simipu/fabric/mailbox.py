"""Shared-memory mailboxes between the instances of one host: small frames without a system call.

A frame between two instances of one host can travel two ways: over their
Unix socket (any size; file descriptors too), or through a *mailbox* in
shared memory (up to ``SLOT_BYTES``). Each instance owns one segment, an
anonymous ``memfd`` mapped shared (nothing in /dev/shm, so nothing to clean
up, SIGKILL included), and sends its descriptor to each same-host peer once,
when the mesh is built; peers map it read-only. Every instance writes only to
its own segment.

Layout of an instance's segment: a header (its *sleeping* flag, on a cache
line of its own), then one block per same-host peer, by the peer's position
among the host's instances::

    [sent: frames written to that peer][consumed: frames read from that peer][slot 0][slot 1]

A slot holds ``[link frame index][length][header and payload]``. The writer
fills slot ``sent % 2`` and then bumps ``sent``; the reader, seeing
``sent > consumed`` in the peer's block, reads slot ``consumed % 2`` and then
bumps its own ``consumed``. A writer with both slots unread sends that frame
over the socket instead, so a sender never waits for a mailbox. The frame
index in each slot keeps the link's order: the receiver takes the mailbox's
frame only if it is the next one on the link, else the next one is on the
socket (its bytes were sent after any earlier mailbox write, so by the time
they are read that write is visible).

Memory order: x86-64 keeps stores in order and loads in order, so "slot, then
counter" and "counter, then slot" need no fence there; mailboxes are only
used on x86-64 (elsewhere every frame takes the socket). A receiver that
stops spinning and sleeps in ``poll`` raises its sleeping flag first; a
writer that finds the flag raised after writing sends one ``WAKE`` byte on
the socket. That is a store-then-load on both sides (Dekker's pattern), so
both sides put a full fence between them (``full_fence``): then either the
sleeper sees the frame or the writer sees the flag, and no wake-up is lost.
A peer that dies is seen as before, by its socket (EOF) or the rendezvous.
"""

from __future__ import annotations

import mmap
import os
import platform
import threading

#: Bytes per slot: a frame up to this size (less 16 for the slot's own header) goes through shared memory.
SLOT_BYTES = 64 * 1024 + 1024
_LINE = 64
_HEADER = 2 * _LINE  # magic line, then the sleeping flag's line
_SLEEPING = _LINE // 8  # index of the sleeping flag among 8-byte words
_SENT, _CONSUMED = 0, _LINE // 8  # word offsets in a block
_SLOTS = 2 * _LINE  # byte offset of slot 0 in a block
_BLOCK = _SLOTS + 2 * SLOT_BYTES
_MAGIC = 0x31584F424C49414D  # "MAILBOX1"

#: ``peek`` answers: the mailbox is empty / its next frame is a later one (the next is on the socket).
EMPTY, ELSEWHERE = None, False

_fence_lock = threading.Lock()


def full_fence() -> None:
    """A full memory barrier: acquiring and releasing a lock executes a locked (serialising) instruction on x86."""
    _fence_lock.acquire()
    _fence_lock.release()


def supported() -> bool:
    """Mailboxes need memfd and x86-64's store order (see the module docstring)."""
    return hasattr(os, "memfd_create") and platform.machine().lower() in ("x86_64", "amd64")


class MailboxSegment:
    """This instance's mailbox memory, and the segments of the same-host peers it has mapped."""

    def __init__(self, label: str, local: tuple[int, ...], me: int) -> None:
        self.local = local
        self.me = me
        size = _HEADER + len(local) * _BLOCK
        self.fd = os.memfd_create(label, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._words = memoryview(self._map).cast("Q")
        self._words[0] = _MAGIC
        self._peer_maps: list[mmap.mmap] = []
        self._boxes: list[Mailbox] = []

    def attach(self, peer: int, fd: int) -> Mailbox:
        """Map ``peer``'s segment (received as ``fd``, which this closes) and return our mailboxes with it."""
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        theirs = memoryview(mapped)
        if size < _HEADER + len(self.local) * _BLOCK or theirs.cast("Q")[0] != _MAGIC:
            theirs.release()
            mapped.close()
            raise ValueError(f"instance {peer} sent a mailbox segment that is not one")
        self._peer_maps.append(mapped)
        mine = memoryview(self._map)
        mine_at, theirs_at = _HEADER + self.local.index(peer) * _BLOCK, _HEADER + self.local.index(self.me) * _BLOCK
        box = Mailbox(mine[mine_at:mine_at + _BLOCK], theirs[theirs_at:theirs_at + _BLOCK],
                      theirs[:_HEADER].cast("Q"))
        self._boxes.append(box)
        return box

    def set_sleeping(self, sleeping: bool) -> None:
        """Raise (with a fence: see the module docstring) or lower this instance's sleeping flag."""
        self._words[_SLEEPING] = int(sleeping)
        if sleeping:
            full_fence()

    def close(self) -> None:
        for box in self._boxes:
            box.release()
        self._boxes.clear()
        self._words.release()
        for mapped in [self._map, *self._peer_maps]:
            try:
                mapped.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes with it
        self._peer_maps.clear()
        os.close(self.fd)


class Mailbox:
    """One same-host peer: our mailbox to it (our block for it) and its mailbox to us (its block for us)."""

    __slots__ = ("_out", "_out_words", "_in", "_in_words", "_peer_header", "capacity")

    def __init__(self, out: memoryview, into: memoryview, peer_header: memoryview) -> None:
        self._out, self._in = out, into
        self._out_words, self._in_words = out.cast("Q"), into.cast("Q")
        self._peer_header = peer_header
        #: The largest frame (header and payload) a slot holds.
        self.capacity = SLOT_BYTES - 16

    def try_send(self, index: int, header: bytes, payload: memoryview) -> bool:
        """Write frame number ``index`` of the link into the free slot; False if both slots are still unread."""
        sent = self._out_words[_SENT]
        if sent - self._in_words[_CONSUMED] >= 2:
            return False
        at = _SLOTS + (sent & 1) * SLOT_BYTES
        hlen, total = len(header), len(header) + len(payload)
        out = self._out
        out[at + 16:at + 16 + hlen] = header
        if total > hlen:
            out[at + 16 + hlen:at + 16 + total] = payload
        words = self._out_words
        words[at // 8] = index
        words[at // 8 + 1] = total
        words[_SENT] = sent + 1  # publish: after the slot (x86-64 keeps stores in order)
        return True

    def peer_sleeping(self) -> bool:
        """After a ``try_send``: does the peer need a WAKE byte? (Fenced: see the module docstring.)"""
        full_fence()
        return bool(self._peer_header[_SLEEPING])

    def peek(self, index: int) -> memoryview | None | bool:
        """The peer's next unread frame if it is frame ``index`` of the link; EMPTY or ELSEWHERE if not."""
        consumed = self._out_words[_CONSUMED]
        if self._in_words[_SENT] == consumed:
            return EMPTY
        at = _SLOTS + (consumed & 1) * SLOT_BYTES
        words = self._in_words
        if words[at // 8] != index:
            return ELSEWHERE
        return self._in[at + 16:at + 16 + words[at // 8 + 1]]

    def consume(self) -> None:
        """Done with the frame ``peek`` returned: its slot may be written again."""
        self._out_words[_CONSUMED] += 1

    def release(self) -> None:
        for view in (self._out_words, self._in_words, self._peer_header, self._out, self._in):
            view.release()
