"""A simulated IPU system: hardware figures and device ids (here), IPU devices and their locks
(``simipu.devices``), a V-IPU service, server and client (``simipu.vipu``) and the fabric that connects
instances for collectives (``simipu.fabric``)."""

from simipu.hardware import (
    IPU_MEMORY_BYTES,
    IPUS_PER_M2000,
    TILE_MEMORY_BYTES,
    TILES_PER_IPU,
    device_id,
    first_device_id,
    parent_device_id,
)

__all__ = [
    "IPU_MEMORY_BYTES",
    "IPUS_PER_M2000",
    "TILE_MEMORY_BYTES",
    "TILES_PER_IPU",
    "device_id",
    "first_device_id",
    "parent_device_id",
]
