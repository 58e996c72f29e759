"""``popdist.tensorflow`` (user guide 4.2.4): an IPU configuration for this instance.

``set_ipu_config(config)`` selects this instance's device and sets the
multi-replica distribution (process count and index) of a TensorFlow
``IPUConfig``, or of any object with the same attributes; with TensorFlow's
deprecated ``IpuOptions`` protobuf it uses TensorFlow's own helpers.
"""

from __future__ import annotations

from typing import Any

from popdist.core import getDeviceId, getInstanceIndex, getNumInstances

__all__ = ["set_ipu_config"]


def set_ipu_config(config: Any, ipus_per_replica: int | None = None, configure_device: bool = True) -> Any:
    """Update ``config`` for this instance and return it (the guide's signature; the IPU count is optional)."""
    device_id = getDeviceId(ipus_per_replica) if configure_device else None
    if hasattr(config, "experimental"):  # IPUConfig, and anything shaped like it
        if device_id is not None:
            config.select_ipus = [device_id]
        distribution = config.experimental.multi_replica_distribution
        distribution.process_count = getNumInstances()
        distribution.process_index = getInstanceIndex()
        return config
    return _set_ipu_options(config, device_id)


def _set_ipu_options(config: Any, device_id: int | None) -> Any:
    """TensorFlow 1's ``IpuOptions`` protobuf, through TensorFlow's helpers (which return the config)."""
    try:
        from tensorflow.python.ipu import utils
    except ImportError:
        raise TypeError(
            f"set_ipu_config() needs an IPUConfig (or an object with select_ipus and "
            f"experimental.multi_replica_distribution), got {type(config).__name__}"
        ) from None
    if device_id is not None:
        config = utils.select_ipus(config, [device_id])
    return utils.set_experimental_multi_replica_distribution_options(
        config, process_count=getNumInstances(), process_index=getInstanceIndex())
