"""The phase numbers a collective's frames carry, by name.

A collective moves its frames in one or more *phases*; every frame header
carries the phase (``frames.header``), so a receiver that expected another
phase of the same call sees a mismatch instead of wrong bytes. Which phases a
call runs depends on its algorithm; all members of a group run the same ones.
"""

from __future__ import annotations

from enum import IntEnum


class Phase(IntEnum):
    """The phases, grouped by the algorithms that run them (values are on the wire: never renumber)."""

    #: Sockets and boards (``engine``): the first round, often the only one: whole arrays to every member
    #: (small), each member's chunks to their owners (reduce-scatter), or the root's data (broadcast).
    FIRST = 1
    #: The second round: each owner's reduced or received chunk to every other member (allgather).
    SECOND = 2
    #: Shared memory (``shared``): wait until every peer has read the half of the *whole* layout we last wrote,
    #: before a call of another layout overwrites it.
    SHARED_DRAIN = 10
    #: Shared memory: "my input is in my segment" (its size; its descriptor the first time).
    SHARED_READY = 11
    #: Shared memory, *chunked* layout: "my chunk is reduced, in my segment".
    SHARED_REDUCED = 12
    #: Shared memory, *chunked* layout: "I have finished reading your segments" (no longer sent: the next call's
    #: SHARED_READY says it; the number stays taken).
    SHARED_DONE = 13
    #: Hierarchical (``hierarchical``): within each host, every member's array (or its announcement) to the
    #: host's leader.
    TO_LEADER = 21
    #: Hierarchical: within each host, the leader's result (or its announcement) to every member.
    FROM_LEADER = 23
    #: Cross-memory reads (``cross_memory``), once per group: "my pid, and a token at this address: read it".
    CROSS_PROBE = 31
    #: Cross-memory reads, once per group: "I could read every peer's token" (or not).
    CROSS_VERDICT = 32
    #: Cross-memory reads: "my array is at this address" (a broadcast's non-root: no array).
    CROSS_READY = 33
    #: Cross-memory reads: "I have finished reading your arrays" (and whether it worked).
    CROSS_DONE = 34
