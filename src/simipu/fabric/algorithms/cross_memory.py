"""Large broadcasts and allgathers among the instances of one host with ONE copy: read the peer's array in place.

``shared_copies`` moves an array through the owner's shared segment: the
owner copies it in, each reader copies it out. Above ``CROSS_MEMORY_BYTES``
those copies run at memory bandwidth, so the second one is what separates
us from Open MPI, whose shared-memory transport lets the receiver read the
sender's buffer directly (Linux's cross-memory attach, ``process_vm_readv``
(2)). This module does the same: a member announces the address of its
array, the peers read it straight into their result, one system call each.

Per call, two phases, both all-to-all (so each carries the mismatch check on
every pair, and a member returns only when every peer has finished with its
array):

* CROSS_READY: "my array is at this address" (the broadcast's root; every
  member in an allgather);
* the reads (``process_vm_readv`` into the caller's result or ``out=``);
* CROSS_DONE: "I have finished reading", with whether the reads worked. A
  member whose read failed still sends it, so nobody is left waiting, and
  every member raises the same ``FabricError`` afterwards. A peer that died
  meanwhile (its pid even reused) is caught here: its link hits EOF, so
  nothing read from a stranger is ever returned.

Permission. Reading another process's memory is allowed by the kernel's
ptrace access check (same user and a dumpable process, or CAP_SYS_PTRACE;
Yama's ``kernel.yama.ptrace_scope`` 1 limits it to declared tracers, 2 to
administrators, 3 to nobody). We never widen it (``PR_SET_PTRACER`` would
let the peer ptrace us: stop us, write our memory, far more than reading one
array), we ask once what it allows: the first large copy of a group runs
CROSS_PROBE (each member's pid and the address of a random token; each
reads every peer's token) and CROSS_VERDICT (whether all of them matched).
Only if every member could read every peer does the group take this path;
otherwise it stays on ``shared_copies`` for good. Every member decides the
same way from the same verdicts, so all run the same phases.

What a peer announces is trusted as far as the link it came on is
(authenticated, same host); a wrong address can only make us read the
peer's own memory, or fail, which raises.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from typing import Any

import numpy as np

from ..errors import FabricError, PeerLostError
from .calls import Call
from .phases import Phase
from .protocol import Phases

#: From this many bytes per array, a broadcast or allgather among the instances of one host reads the
#: peers' arrays in place (one copy) instead of through their shared segments (two). Measured on 2 cores,
#: against the segments (see the README's "Broadcast and allgather").
CROSS_MEMORY_BYTES = 8 * 1024 * 1024

_PROBE = struct.Struct("<QQ16s")  # pid, address of the token, the token
_READY = struct.Struct("<QQ")  # address, bytes (0, 0 from a broadcast's non-root)
_OK, _FAILED = b"\x01", b"\x00"
#: CROSS_DONE's frame: the status (``_OK`` or ``_FAILED``) and the instance found gone while being read (-1: none).
_DONE = struct.Struct("<ci")


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _load_readv() -> Any:
    """libc's ``process_vm_readv``, or None where there is none (not Linux, or an old libc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        readv = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    readv.restype = ctypes.c_ssize_t
    readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                      ctypes.c_ulong, ctypes.c_ulong]
    return readv


_readv = _load_readv()


def read_peer(pid: int, address: int, into: np.ndarray) -> None:
    """Copy ``into.nbytes`` bytes at ``address`` in process ``pid`` into ``into`` (C-contiguous), or raise
    OSError. (One call moves it all unless the kernel stops short; then the rest is asked for again.)"""
    if _readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available")
    base, total, done = into.ctypes.data, into.nbytes, 0
    while done < total:
        local, remote = _IoVec(base + done, total - done), _IoVec(address + done, total - done)
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            code = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise OSError(code, f"process_vm_readv from pid {pid}: {os.strerror(code)}")
        done += got


class CrossMemory:
    """One group's answer to "may every member read every peer's memory?" (None until the probe ran)."""

    def __init__(self) -> None:
        self.usable: bool | None = None
        #: Each peer's pid by rank, from the probe.
        self.pids: dict[int, int] = {}
        #: How many calls took this path (tests count them).
        self.calls = 0

    def wanted(self, phases: Phases, call: Call, nbytes: int) -> bool:
        """Whether this call (``nbytes`` per array, the same on every member) reads in place: probes the group
        first if this is its first call that large."""
        if nbytes < CROSS_MEMORY_BYTES:
            return False
        if self.usable is None:  # (a member without process_vm_readv takes part too: its verdict is "no")
            self.usable = _probe(phases, call, self.pids)
        return self.usable


def _probe(phases: Phases, call: Call, pids: dict[int, int]) -> bool:
    """CROSS_PROBE then CROSS_VERDICT (module docstring): True if every member read every peer's token; fills
    ``pids``."""
    g = call.group
    token = os.urandom(16)
    held = np.frombuffer(bytearray(token), dtype=np.uint8)  # (kept alive until the verdicts are in)
    received = [bytearray(_PROBE.size) for _ in g.others]
    phases.run_all(call, Phase.CROSS_PROBE, memoryview(_PROBE.pack(os.getpid(), held.ctypes.data, token)),
                   [memoryview(b) for b in received])
    mine = True
    for k, payload in zip(g.others, received):
        pid, address, theirs = _PROBE.unpack(payload)
        pids[k] = pid
        got = np.zeros(16, dtype=np.uint8)
        try:
            read_peer(pid, address, got)
        except OSError:
            mine = False
            break
        mine = mine and got.tobytes() == theirs
    verdicts = [bytearray(1) for _ in g.others]
    phases.run_all(call, Phase.CROSS_VERDICT, memoryview(_OK if mine else _FAILED), [memoryview(v) for v in verdicts])
    del held
    return mine and all(bytes(v) == _OK for v in verdicts)


def broadcast_cross(phases: Phases, cross: CrossMemory, call: Call, x: np.ndarray, result: np.ndarray,
                    root_rank: int) -> None:
    """Fill ``result`` with the root's array, every non-root reading it from the root's memory."""
    g = call.group
    root = g.rank == root_rank
    announced = _ready(phases, call, x if root else None)
    failure = None
    if root:
        if result is not x:
            result[...] = x
    else:
        failure = _read(announced[root_rank], cross, call, root_rank, result.reshape(-1).view(np.uint8))
    _done(phases, cross, call, failure)


def allgather_cross(phases: Phases, cross: CrossMemory, call: Call, x: np.ndarray, result: np.ndarray) -> None:
    """Fill ``result`` (shape ``(members, *x.shape)``) with every member's array, each row read from its owner."""
    g = call.group
    announced = _ready(phases, call, x)
    rows = result.reshape(len(g.members), -1).view(np.uint8)
    rows[g.rank] = x.reshape(-1).view(np.uint8)
    failure = None
    size = len(g.members)
    for k in ((g.rank + step) % size for step in range(1, size)):  # (each starts at the next: no crowd at one)
        failure = failure or _read(announced[k], cross, call, k, rows[k])
    _done(phases, cross, call, failure)


def _ready(phases: Phases, call: Call, x: np.ndarray | None) -> dict[int, tuple[int, int]]:
    """Phase CROSS_READY: my array's address and size to every peer (0, 0 if I hold none); theirs, by rank."""
    g = call.group
    received = [bytearray(_READY.size) for _ in g.others]
    mine = _READY.pack(0, 0) if x is None else _READY.pack(x.ctypes.data, x.nbytes)
    phases.run_all(call, Phase.CROSS_READY, memoryview(mine), [memoryview(b) for b in received])
    return {k: _READY.unpack(b) for k, b in zip(g.others, received)}


def _read(announced: tuple[int, int], cross: CrossMemory, call: Call, rank: int,
          into: np.ndarray) -> tuple[str, int] | None:
    """Read one peer's announced array into ``into``; why it failed and, if the peer is gone (no such
    process), which instance it was (else -1); or None."""
    address, nbytes = announced
    peer = call.group.members[rank]
    if nbytes != into.nbytes:
        return f"instance {peer} announced {nbytes} bytes where {into.nbytes} were expected", -1
    try:
        read_peer(cross.pids[rank], address, into)
    except OSError as exc:
        return f"reading instance {peer}'s array failed: {exc.strerror or exc}", peer if exc.errno == errno.ESRCH else -1
    return None


def _done(phases: Phases, cross: CrossMemory, call: Call, failure: tuple[str, int] | None) -> None:
    """Phase CROSS_DONE: every member has finished reading (or failed to); raise if any failed: a peer found
    gone (its process no longer exists: it died after sending this phase's frame) as every other loss, named,
    on every member that read it or heard of it; any other failure as a ``FabricError``."""
    g = call.group
    statuses = [bytearray(_DONE.size) for _ in g.others]
    mine = _DONE.pack(_FAILED if failure else _OK, failure[1] if failure else -1)
    phases.run_all(call, Phase.CROSS_DONE, memoryview(mine), [memoryview(s) for s in statuses])
    cross.calls += 1
    theirs = [_DONE.unpack(s) for s in statuses]
    failed = [g.members[k] for k, (status, _) in zip(g.others, theirs) if status != _OK]
    lost = [gone for _, gone in theirs if gone >= 0]
    if failure or failed:
        cross.usable = False
        if failure and failure[1] >= 0 or lost:
            gone = failure[1] if failure and failure[1] >= 0 else lost[0]
            raise PeerLostError(gone, "its process ended while its array was being read in place")
        raise FabricError(failure[0] if failure else f"instance {failed[0]} could not read a peer's array in "
                          "place (process_vm_readv); this fabric is unusable now")
