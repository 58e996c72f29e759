"""Horovod's exception classes (``horovod.common.exceptions``), for programs that catch them.

A collective that fails here raises one of the fabric's errors (a lost peer, a mismatched call: see
``simipu.fabric.errors``), whose base, ``FabricError``, is ``HorovodInternalError`` by that name, so
``except HorovodInternalError`` catches what it catches under Horovod. ``HostsUpdatedInterrupt`` belongs to
Horovod's elastic mode, which poprun-py does not provide: nothing raises it.
"""

from __future__ import annotations

from simipu.fabric.errors import FabricError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]

HorovodInternalError = FabricError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic mode's: the hosts changed (never raised here)."""
