"""Shared-memory mailboxes between the instances of one host: small frames without a system call.

A frame between two instances of one host can travel two ways: over their
Unix socket (any size; file descriptors too), or through a *mailbox* in
shared memory (up to ``SLOT_BYTES``). Each instance owns one segment, an
anonymous ``memfd`` mapped shared (nothing in /dev/shm, so nothing to clean
up, SIGKILL included), and sends its descriptor to each same-host peer once,
when the mesh is built; peers map it too, and read it only through read-only
views. Every instance writes only to its own segment. (The peers' mapping is
read-write at the page level all the same: with the peer's pages mapped
read-only, a 4 KiB exchange between two processes took 0.75 us against 0.55
us in C on this machine, and a 2-instance 4 KiB allreduce 0.2-0.9 us more a
call; the views keep our code from writing there.)

Layout of an instance's segment: a header (a line with its magic number and
the CPU it last ran on, for ``algorithms.placement``; then its *sleeping* flag, on a
cache line of its own), then one block per same-host peer, by the peer's
position among the host's instances::

    [sent: frames written to that peer][consumed: frames read from that peer]
    [slot 0][slot 1]

then the board (below).

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

The *board*: when every instance of the job is on this host, a frame that
goes to every peer at once (the small collectives' common phase) is written
once, to the writer's board, instead of once per peer. After the blocks, a
segment holds ``[board slot 0][board slot 1]``; a board slot is ``[publication
number][length][the frame's offset in the slot][the link frame index for each
local instance][header and payload]``, the offset putting the payload on a
cache line of its own (``board_frame_at``) so that a reader can reduce straight
from it. Publication p (from 1) goes to slot ``p % 2``, its number written
last. Each reader takes the writer's publications in order, counting them
itself. For a reader a board frame is simply the link's frame with that index,
like a mailbox frame: the same order, the same header checks, the same
wake-ups. Board frames go to every instance (the whole job's group), so every
reader takes every publication.

Publication p overwrites p - 2 without asking whether its readers are done
with it, because they must be: the writer publishes p in a collective of the
whole job, after finishing the one in which it published p - 1; finishing
that took a frame from every peer (a board phase receives from every peer),
and a peer sends that collective's frame only after finishing every earlier
collective, among them the one where it took p - 2. (A collective that
publishes nothing on the boards, as the small broadcast among three or more
instances, ``board_copies.RootBroadcast``, changes none of this.) (The headers' sequence
numbers make "that collective's frame" exact; a mismatch breaks the fabric
first.) So a board needs no counter written by its readers, and a
publication costs the writer no read of the readers' cache lines.
"""

from __future__ import annotations

import mmap
import os
import platform
import threading
from typing import Callable, Final, Literal, Union

#: Bytes per slot: a frame up to this size (less 16 for the slot's own header) goes through shared memory.
SLOT_BYTES = 64 * 1024 + 1024
_LINE = 64
_HEADER = 2 * _LINE  # magic line, then the sleeping flag's line
#: Word offset of the sleeping flag in a segment's header.
SLEEPING = _LINE // 8
#: Word offsets in a board slot: its publication number, the frame's length, its offset, the link frame index
#: for the local instance at position 0 (then 1, 2, ...).
PUBLICATION, LENGTH, OFFSET, INDICES = 0, 1, 2, 3
_SENT, _CONSUMED = 0, _LINE // 8  # word offsets in a block
_SLOTS = 2 * _LINE  # byte offset of slot 0 in a block
_BLOCK = _SLOTS + 2 * SLOT_BYTES
_MAGIC = 0x33584F424C49414D  # "MAILBOX3"

#: ``peek`` answers: the mailbox is empty / its next frame is a later one (the next is on the socket).
EMPTY: Final = None
ELSEWHERE: Final = False
#: What ``peek`` returns: the frame (a truthy view: a frame is never empty), or one of the two answers above.
Peeked = Union[memoryview, None, Literal[False]]

_fence_lock = threading.Lock()
#: ``full_fence`` as two calls, for a hot path that inlines it (a Python call costs more than the fence).
FENCE_ACQUIRE, FENCE_RELEASE = _fence_lock.acquire, _fence_lock.release


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
        self._board_at = _HEADER + len(local) * _BLOCK
        size = self._board_at + _board_bytes(len(local))
        self.fd = os.memfd_create(label, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._words = memoryview(self._map).cast("Q")
        self._words[0] = _MAGIC
        #: Our header, as words: the magic line also holds where we run (``placement.CPU``).
        self.header_words = self._words[:_HEADER // 8]
        self._peer_maps: list[mmap.mmap] = []
        self._boxes: list[Mailbox] = []
        self._board = memoryview(self._map)[self._board_at:]
        self._board_words = self._board.cast("Q")
        self._board_slot = _board_slot(len(local))
        #: The largest frame (header and payload) a board publication holds.
        self.board_capacity = SLOT_BYTES - 16 - _LINE
        #: How many frames this instance has published on its board.
        self.publications = 0

    def attach(self, peer: int, fd: int) -> Mailbox:
        """Map ``peer``'s segment (received as ``fd``, which this closes) and return our mailboxes with it."""
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)  # (docstring)
        finally:
            os.close(fd)
        theirs = memoryview(mapped).toreadonly()
        if size < self._board_at + _board_bytes(len(self.local)) or theirs.cast("Q")[0] != _MAGIC:
            theirs.release()
            mapped.close()
            raise ValueError(f"instance {peer} sent a mailbox segment that is not one")
        self._peer_maps.append(mapped)
        mine = memoryview(self._map)
        position = self.local.index(peer)
        mine_at, theirs_at = _HEADER + position * _BLOCK, _HEADER + self.local.index(self.me) * _BLOCK
        box = Mailbox(mine[mine_at:mine_at + _BLOCK], theirs[theirs_at:theirs_at + _BLOCK],
                      theirs[:_HEADER].cast("Q"), theirs[self._board_at:], self.local.index(self.me), position,
                      len(self.local))
        self._boxes.append(box)
        return box

    def publish(self, header: bytes, payload: memoryview, boxes: list[Mailbox], indices: list[int]) -> None:
        """Write one frame for every peer to the board (``indices[i]``: its index on the link to ``boxes[i]``,
        which must be every peer's mailbox), over the frame before last (see the module docstring)."""
        words = self._board_words
        published = self.publications = self.publications + 1
        at = self.board_slot_at(published & 1)
        hlen, total = len(header), len(header) + len(payload)
        start = board_frame_at(at, len(self.local), hlen)
        board = self._board
        board[start:start + hlen] = header
        if total > hlen:
            board[start + hlen:start + total] = payload
        first = at // 8
        words[first + LENGTH] = total
        words[first + OFFSET] = start - at
        for box, index in zip(boxes, indices):
            words[first + INDICES + box.position] = index
        words[first + PUBLICATION] = published  # publish: after the rest of the slot (x86-64 keeps stores in order)

    def board_slot_at(self, parity: int) -> int:
        """Where board slot 0 or 1 starts in a board (ours or a peer's: the layout is the same)."""
        return parity * self._board_slot

    def board_views(self) -> tuple[memoryview, memoryview]:
        """Our board, as bytes and as 8-byte words (for ``board.BoardAllreduce``, which writes it directly)."""
        return self._board, self._board_words

    def set_sleeping(self, sleeping: bool) -> None:
        """Raise (with a fence: see the module docstring) or lower this instance's sleeping flag."""
        self._words[SLEEPING] = int(sleeping)
        if sleeping:
            full_fence()

    def close(self) -> None:
        for box in self._boxes:
            box.release()
        self._boxes.clear()
        self._board_words.release()
        self._board.release()
        self.header_words.release()
        self._words.release()
        for mapped in [self._map, *self._peer_maps]:
            try:
                mapped.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes with it
        self._peer_maps.clear()
        os.close(self.fd)


class Mailbox:
    """One same-host peer: our mailbox to it (our block for it), its mailbox to us (its block for us), and
    its board, which we read the frames for us from."""

    __slots__ = ("_out", "_out_words", "_in", "_in_words", "_peer_header", "capacity", "_board", "_board_words",
                 "_me", "position", "_slot_bytes", "_from_board", "board_taken")

    def __init__(self, out: memoryview, into: memoryview, peer_header: memoryview, peer_board: memoryview,
                 me: int, position: int, local_count: int) -> None:
        self._out, self._in = out, into
        self._out_words, self._in_words = out.cast("Q"), into.cast("Q")
        self._peer_header = peer_header
        self._board, self._board_words = peer_board, peer_board.cast("Q")
        self._me = me  # our position among the host's instances
        #: The peer's position among the host's instances.
        self.position = position
        self._slot_bytes = _board_slot(local_count)
        self._from_board = False  # where the frame ``peek`` last returned is
        #: How many of the peer's board publications we have taken.
        self.board_taken = 0
        #: The largest frame (header and payload) a slot holds.
        self.capacity = SLOT_BYTES - 16

    def try_send(self, index: int, header: bytes | bytearray, payload: memoryview) -> bool:
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

    def fixed_sender(self, hlen: int, total: int) -> Callable[[int, Union[bytes, bytearray], memoryview], bool]:
        """``try_send`` for frames of one size (a ``hlen``-byte header, ``total`` bytes with the payload), with
        each slot's views made once: for a plan that sends such frames call after call
        (``board_copies.RootBroadcast``: slicing the slots on every call was a fifth of a 4 KiB broadcast)."""
        assert total <= self.capacity
        out, out_words, in_words = self._out, self._out_words, self._in_words
        slots = [(at // 8, out[at + 16:at + 16 + hlen], out[at + 16 + hlen:at + 16 + total])
                 for at in (_SLOTS, _SLOTS + SLOT_BYTES)]

        def send(index: int, header: Union[bytes, bytearray], payload: memoryview) -> bool:
            sent = out_words[_SENT]
            if sent - in_words[_CONSUMED] >= 2:
                return False
            first, header_to, payload_to = slots[sent & 1]
            header_to[:] = header
            payload_to[:] = payload
            out_words[first] = index
            out_words[first + 1] = total
            out_words[_SENT] = sent + 1  # publish: after the slot (x86-64 keeps stores in order)
            return True
        return send

    def fixed_receiver(self, hlen: int, total: int) -> Callable[[int, Union[bytes, bytearray], memoryview], bool]:
        """For frames ``fixed_sender(hlen, total)`` sends: ``take(index, header, dest)`` copies the payload of
        frame ``index`` into ``dest`` and frees its slot if that frame is next in the mailbox with ``header``;
        otherwise it takes nothing and returns False (it is not there yet, or it is another frame, or the next
        frame is on the board or the socket: ``peek`` and ``exchange`` find those)."""
        into, out_words, in_words = self._in, self._out_words, self._in_words
        slots = [(at // 8, into[at + 16:at + 16 + hlen], into[at + 16 + hlen:at + 16 + total])
                 for at in (_SLOTS, _SLOTS + SLOT_BYTES)]

        def take(index: int, header: Union[bytes, bytearray], dest: memoryview) -> bool:
            consumed = out_words[_CONSUMED]
            if in_words[_SENT] == consumed:
                return False
            first, header_at, payload_at = slots[consumed & 1]
            if in_words[first] != index or in_words[first + 1] != total or header_at.tobytes() != header:
                return False
            dest[:] = payload_at
            out_words[_CONSUMED] = consumed + 1
            return True
        return take

    def untaken(self) -> list[memoryview]:
        """Our frames in this mailbox that the peer has not taken yet (up to two), oldest first."""
        words = self._out_words
        return [self._out[at + 16:at + 16 + words[at // 8 + 1]]
                for at in (_SLOTS + (k & 1) * SLOT_BYTES for k in range(self._in_words[_CONSUMED], words[_SENT]))]

    def peer_sleeping(self) -> bool:
        """After a ``try_send``: does the peer need a WAKE byte? (Fenced: see the module docstring.)"""
        full_fence()
        return bool(self._peer_header[SLEEPING])

    def peer_asleep(self) -> bool:
        """``peer_sleeping`` for a caller that has fenced already, once after several writes."""
        return bool(self._peer_header[SLEEPING])

    def peek(self, index: int) -> Peeked:
        """The peer's frame ``index`` of the link if its mailbox or its board holds it next; else EMPTY (neither
        holds anything for us) or ELSEWHERE (the next frame is on the socket)."""
        consumed = self._out_words[_CONSUMED]
        mailbox: Literal[False] | None = EMPTY
        if self._in_words[_SENT] != consumed:
            at = _SLOTS + (consumed & 1) * SLOT_BYTES
            words = self._in_words
            if words[at // 8] == index:
                self._from_board = False
                return self._in[at + 16:at + 16 + words[at // 8 + 1]]
            mailbox = ELSEWHERE
        wanted = self.board_taken + 1
        board = self._board_words
        first = (wanted & 1) * self._slot_bytes // 8
        if board[first + PUBLICATION] != wanted:
            return mailbox
        if board[first + INDICES + self._me] != index:
            return ELSEWHERE
        self._from_board = True
        at = first * 8 + board[first + OFFSET]
        return self._board[at:at + board[first + LENGTH]]

    def consume(self) -> None:
        """Done with the frame ``peek`` returned: its slot may be written again."""
        if self._from_board:
            self.board_taken += 1
        else:
            self._out_words[_CONSUMED] += 1

    def reader_views(self) -> tuple[memoryview, memoryview, memoryview, int]:
        """For ``board.BoardAllreduce``, which reads the peer's board directly: the peer's header (as words),
        its board (as bytes and as words), and our position among the host's instances."""
        return self._peer_header, self._board, self._board_words, self._me

    def release(self) -> None:
        for view in (self._out_words, self._in_words, self._peer_header, self._out, self._in, self._board_words,
                     self._board):
            view.release()


def _board_slot(local_count: int) -> int:
    """Bytes per board slot: its number, length and frame offset words, an index per local instance, the
    frame (and up to a cache line before it, to align its payload), rounded up to whole cache lines."""
    return -(-(8 * (INDICES + local_count) + SLOT_BYTES) // _LINE) * _LINE


def board_frame_at(slot_at: int, local_count: int, hlen: int) -> int:
    """Where a frame with an ``hlen``-byte header starts in the board slot at ``slot_at``: after the slot's
    words, placed so that its payload starts a cache line (a board starts one), aligned for any dtype."""
    earliest = slot_at + 8 * (INDICES + local_count) + hlen
    return earliest + (-earliest) % _LINE - hlen


def _board_bytes(local_count: int) -> int:
    return 2 * _board_slot(local_count)
