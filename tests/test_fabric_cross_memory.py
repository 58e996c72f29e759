"""``cross_memory.read_peer``: another process's memory read in place, and the errors that end the path."""

from __future__ import annotations

import errno
import subprocess
import sys

import numpy as np
import pytest

from simipu.fabric.algorithms.cross_memory import read_peer

#: A process that holds a known array and prints its address, then waits for its stdin to close.
HOLDER = ("import sys, numpy as np; a = np.arange(300_000, dtype=np.float32); print(a.ctypes.data, flush=True); "
          "sys.stdin.read()")


def test_a_peer_array_is_read_whole_and_a_bad_address_or_a_gone_process_raises() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = int(holder.stdout.readline())  # type: ignore[union-attr]
        into = np.zeros(300_000, dtype=np.float32)
        read_peer(holder.pid, address, into)
        assert into.tobytes() == np.arange(300_000, dtype=np.float32).tobytes()
        with pytest.raises(OSError) as bad:
            read_peer(holder.pid, 8, into)  # (the first page is never mapped)
        assert bad.value.errno == errno.EFAULT
    finally:
        holder.communicate("", timeout=30)
    with pytest.raises(OSError) as gone:
        read_peer(holder.pid, address, into)
    assert gone.value.errno == errno.ESRCH
