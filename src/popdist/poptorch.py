"""``popdist.poptorch.Options`` (user guide 4.2.3): PopTorch options that take their distribution from poprun.

Programs written for Graphcore's SDK create ``popdist.poptorch.Options()``
(also ``Options(n)`` or ``Options(ipus_per_replica=n)``) instead of
``poptorch.Options()`` when ``popdist.isPopdistEnvSet()``. Under poprun the
replication factor is the instance's local replicas, ``Distributed.processId``
and ``numProcesses`` are the instance index and count, and the device is
``popdist.getDeviceId()`` (none in offline mode); outside poprun the process
is 0 of 1. What the launch decides cannot be changed afterwards: the setters
``useIpuId``, ``replicationFactor``, ``Distributed.disable``,
``Distributed.setEnvVarNames`` and ``Distributed.configureProcessId`` raise
``RuntimeError`` with Graphcore's message, wherever the program runs.

When PopTorch is importable, ``Options`` is a real subclass of
``poptorch.Options``; otherwise it builds on ``popdist.Options``, which
``popdist.data.DataLoader`` reads. Either way ``randomSeed(n)`` also seeds
torch when torch is installed, as PopTorch's does: two instances that build a
model after seeding then start from the same weights.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NoReturn

from popdist.core import getDeviceId, getInstanceIndex, getNumInstances
from popdist.env import InstanceEnv
from popdist.options import Options as _PopdistOptions
from popdist.options import _DistributedOptions, check_ipus_per_replica

try:  # the real PopTorch needs the Poplar SDK; without it the options build on popdist.Options
    import poptorch as _poptorch
except ImportError:
    _poptorch = None

__all__ = ["Options"]


def _blocked(name: str) -> NoReturn:
    raise RuntimeError(f"Cannot call `{name}` with popdist.poptorch.Options: poprun decides it "
                       f"(change the poprun options instead)")


def _seed_torch(seed: int) -> None:
    """Seed torch too, as PopTorch's ``randomSeed`` does, when torch is installed."""
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)


class _LaunchedDistributed(_DistributedOptions):
    """``Distributed`` fixed by the launch: this instance of the job's, or 0 of 1 outside poprun."""

    def __init__(self, launched: tuple[int, int] | None, environ: Mapping[str, str]) -> None:
        self._launched = launched
        self._process_id, self._num_processes = launched or (0, 1)  # Open MPI's variables are not read here

    def configureProcessId(self, *args: Any, **kwargs: Any) -> NoReturn:
        _blocked("Distributed.configureProcessId")

    def setEnvVarNames(self, *args: Any, **kwargs: Any) -> NoReturn:
        _blocked("Distributed.setEnvVarNames")

    def disable(self) -> NoReturn:
        _blocked("Distributed.disable")


class _OwnOptions(_PopdistOptions):
    """``popdist.Options`` with the launch's settings locked in (no PopTorch installed)."""

    _distributed_options = _LaunchedDistributed

    def __init__(self, ipus_per_replica: int | None = None, **kwargs: Any) -> None:
        super().__init__(ipus_per_replica, **kwargs)
        launch = self._launch
        self._device_id = None if launch is None or launch.offline else getDeviceId(ipus_per_replica)

    @property
    def device_id(self) -> int | None:
        """The Poplar device id this instance uses (None outside poprun and in offline mode)."""
        return self._device_id

    def useIpuId(self, *args: Any, **kwargs: Any) -> NoReturn:
        _blocked("useIpuId")

    def replicationFactor(self, *args: Any, **kwargs: Any) -> NoReturn:
        _blocked("replicationFactor")

    def randomSeed(self, random_seed: int) -> _OwnOptions:
        super().randomSeed(random_seed)
        _seed_torch(random_seed)
        return self

    def __getattr__(self, name: str) -> Any:
        """A PopTorch option these options lack: say why, where a bare AttributeError would not."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"popdist.poptorch.Options has no {name!r} here: PopTorch is not installed, so the options build on "
            "popdist.Options, which holds what poprun decides and what popdist.data reads (replication, "
            "device iterations, gradient accumulation, the seed). Install the Poplar SDK's poptorch for the "
            "rest of PopTorch's options, or drop the call when running without it")


def _poptorch_options(base: Any) -> type:
    """A subclass of the real ``poptorch.Options`` configured from the launch."""

    class Options(base):
        def __init__(self, ipus_per_replica: int | None = None, **kwargs: Any) -> None:
            launch = InstanceEnv.from_environ(os.environ)
            check_ipus_per_replica(ipus_per_replica, launch)
            super().__init__(**kwargs)
            if launch is not None:
                base.replicationFactor(self, launch.num_local_replicas)
                if not launch.offline:
                    base.useIpuId(self, getDeviceId(ipus_per_replica))
            distributed = self.Distributed
            type(distributed).configureProcessId(distributed, getInstanceIndex(), getNumInstances())
            # PopTorch's option objects route attribute writes through their own __setattr__.
            object.__setattr__(distributed, "__class__", _blocking(type(distributed)))

        def useIpuId(self, *args: Any, **kwargs: Any) -> NoReturn:
            _blocked("useIpuId")

        def replicationFactor(self, *args: Any, **kwargs: Any) -> NoReturn:
            _blocked("replicationFactor")

    Options.__module__ = __name__
    Options.__qualname__ = "Options"
    return Options


def _blocking(distributed: type) -> type:
    """PopTorch's ``Distributed`` options class with the launch-decided setters blocked: made once, and kept
    as this module's ``_BlockedDistributed``, where pickle finds it (PopTorch's ``save`` and
    ``compileAndExport`` pickle the options)."""
    global _BlockedDistributed
    if _BlockedDistributed is None or _BlockedDistributed.__bases__ != (distributed,):
        _BlockedDistributed = type("_BlockedDistributed", (distributed,), {
            "__module__": __name__,
            "configureProcessId": lambda self, *a, **k: _blocked("Distributed.configureProcessId"),
            "setEnvVarNames": lambda self, *a, **k: _blocked("Distributed.setEnvVarNames"),
            "disable": lambda self, *a, **k: _blocked("Distributed.disable"),
        })
    return _BlockedDistributed


_BlockedDistributed: type | None = None


_OwnOptions.__name__ = _OwnOptions.__qualname__ = "Options"
Options: type = _OwnOptions if _poptorch is None else _poptorch_options(_poptorch.Options)
