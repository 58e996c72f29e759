"""Waiting on descriptors with ``poll``, never ``select()``.

A launcher with many instances has descriptors numbered past 1,024, which
``select()`` cannot watch (it raises ``ValueError``); ``poll`` has no such
ceiling and needs no selector object for a one-off wait.
"""

from __future__ import annotations

import select
from typing import Collection


def readable(fds: Collection[int], timeout: float | None) -> list[int]:
    """Which of ``fds`` are readable (or at end of stream, or a pidfd's process exited) within ``timeout`` s."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(None if timeout is None else max(0.0, timeout) * 1000)]
