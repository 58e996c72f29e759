"""A simulated IPU system: hardware figures, device ids (and later V-IPU, fabric)."""

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
