"""``popdist.Options``: the replication, batching and seed settings of a data-parallel program.

Modelled on Graphcore's ``popdist.poptorch.Options`` (an extension of
``poptorch.Options``), without PopTorch: the same setter names
(``replicationFactor``, ``deviceIterations``, ``Training.gradientAccumulation``,
``randomSeed``, ``Distributed.configureProcessId``) and the same meaning
(``replicationFactor`` is the number of *local* replicas, per process).

* Under poprun the distributed settings come from the launch: the local
  replicas, this process's index and the number of processes. A setter that
  would contradict them raises ``LaunchConflict`` saying which poprun option
  to change instead (Graphcore's PopDist likewise stops programs changing
  ``poptorch.Options.Distributed`` under PopRun).
* With your own launcher (PopTorch's "distributed execution without PopRun"),
  call ``Distributed.configureProcessId(process_id, num_processes)``; as in
  PopTorch, the Open MPI variables are read by default, so ``mpirun`` needs
  nothing.

``popdist.data.DataLoader`` takes a snapshot (``settings()``) when created,
so later changes to the options do not alter a loader already made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from popdist.env import OMPI_RANK, OMPI_SIZE, InstanceEnv

__all__ = ["LaunchConflict", "Options", "ReplicaSettings"]


class LaunchConflict(RuntimeError):
    """A setting contradicts what poprun launched; the message names the poprun option to change."""


@dataclass(frozen=True)
class ReplicaSettings:
    """A snapshot of the options that decide how data is divided and how much a step consumes."""

    replication_factor: int = 1  # replicas in this process
    device_iterations: int = 1
    gradient_accumulation: int = 1
    random_seed: int | None = None
    process_id: int = 0
    num_processes: int = 1

    def __post_init__(self) -> None:
        for name in ("replication_factor", "device_iterations", "gradient_accumulation", "num_processes"):
            _check_count(name, getattr(self, name))
        if self.random_seed is not None:
            _check_seed(self.random_seed)
        if not _is_int(self.process_id) or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process_id must be an integer in [0, {self.num_processes}), got {self.process_id!r}")

    @classmethod
    def of(cls, options: Any) -> ReplicaSettings:
        """The settings of options with PopTorch's names: ``popdist.Options`` and ``poptorch.Options`` alike."""
        return cls(
            replication_factor=options.replication_factor,
            device_iterations=options.device_iterations,
            gradient_accumulation=options.Training.gradient_accumulation,
            random_seed=getattr(options, "random_seed", None),  # (PopTorch's exists once ``randomSeed`` is called)
            process_id=options.Distributed.processId,
            num_processes=options.Distributed.numProcesses,
        )

    @property
    def total_replicas(self) -> int:
        """Replicas across all processes (every process holds as many)."""
        return self.replication_factor * self.num_processes

    @property
    def replica_offset(self) -> int:
        """Global index of this process's first replica."""
        return self.process_id * self.replication_factor


def check_ipus_per_replica(ipus_per_replica: int | None, launch: InstanceEnv | None) -> None:
    """An options class's ``ipus_per_replica`` (None: the launch's): a count, and the launch's under poprun,
    online or offline (``popdist.Options`` and ``popdist.poptorch.Options`` over PopTorch alike)."""
    if ipus_per_replica is None:
        return
    _check_count("ipus_per_replica", ipus_per_replica)
    if launch is not None and ipus_per_replica != launch.num_ipus_per_replica:
        launch_ipus = launch.num_ipus_per_replica
        raise LaunchConflict(
            f"Options(ipus_per_replica={ipus_per_replica}) contradicts the launch, which has {launch_ipus} "
            f"IPU(s) per replica; pass {launch_ipus} or None, or relaunch with --ipus-per-replica {ipus_per_replica}"
        )


class _TrainingOptions:
    """``options.Training``: settings of the weight update."""

    def __init__(self) -> None:
        self._gradient_accumulation = 1

    @property
    def gradient_accumulation(self) -> int:
        return self._gradient_accumulation

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Micro-batches each replica accumulates before one weight update."""
        self._gradient_accumulation = _check_count("gradientAccumulation", gradient_accumulation)
        return self


class _DistributedOptions:
    """``options.Distributed``: this process's place among the processes of the job."""

    def __init__(self, launched: tuple[int, int] | None, environ: Mapping[str, str]) -> None:
        self._launched = launched
        if launched is not None:
            self._process_id, self._num_processes = launched
        else:
            self._process_id, self._num_processes = 0, 1
            if OMPI_SIZE in environ or OMPI_RANK in environ:  # PopTorch's default: mpirun's names
                self.setEnvVarNames(OMPI_SIZE, OMPI_RANK, environ)

    @property
    def processId(self) -> int:
        return self._process_id

    @property
    def numProcesses(self) -> int:
        return self._num_processes

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        """Declare this process's index and the process count, when not launched by poprun."""
        _check_count("num_processes", num_processes)
        if not _is_int(process_id) or not 0 <= process_id < num_processes:
            raise ValueError(f"configureProcessId: process_id must be an integer in [0, {num_processes}), "
                             f"got {process_id!r}")
        if self._launched is not None and (process_id, num_processes) != self._launched:
            index, count = self._launched
            remedy = "drop the call" if num_processes == count else \
                f"drop the call, or relaunch with --num-instances {num_processes}"
            raise LaunchConflict(
                f"Distributed.configureProcessId({process_id}, {num_processes}) contradicts the launch: poprun "
                f"started this process as instance {index} of {count}. Under poprun the process index and count "
                f"come from the environment; {remedy}"
            )
        self._process_id, self._num_processes = process_id, num_processes
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str,
                       environ: Mapping[str, str] | None = None) -> _DistributedOptions:
        """Read the process count and index from two environment variables (e.g. WORLD_SIZE and RANK)."""
        environ = os.environ if environ is None else environ
        return self.configureProcessId(_read_int(environ, var_process_id, 0),
                                       _read_int(environ, var_num_processes, 1))


class Options:
    """Replication, batching and seed settings; see the module docstring for poprun versus your own launcher.

    ``ipus_per_replica`` is checked against the launch under poprun (as
    Graphcore's ``popdist.poptorch.Options(ipus_per_replica=...)`` is).
    """

    #: Builds ``self.Distributed``; ``popdist.poptorch.Options`` swaps in one whose setters are blocked.
    _distributed_options = _DistributedOptions

    def __init__(self, ipus_per_replica: int | None = None, *, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        launch = InstanceEnv.from_environ(environ)
        self._launch = launch  # the launch this process belongs to (None outside poprun)
        self._under_poprun = launch is not None
        launched: tuple[int, int] | None = None
        self._replication_factor = 1
        launch_ipus = 1
        if launch is not None:
            launched = (launch.instance_index, launch.num_instances)
            self._replication_factor = launch.num_local_replicas
            launch_ipus = launch.num_ipus_per_replica
        check_ipus_per_replica(ipus_per_replica, launch)
        self._ipus_per_replica = ipus_per_replica or launch_ipus
        self._device_iterations = 1
        self._random_seed: int | None = None
        self.Training = _TrainingOptions()
        self.Distributed = self._distributed_options(launched, environ)

    # -- the setters, PopTorch's names ----------------------------------------------------------
    def replicationFactor(self, replication_factor: int) -> Options:
        """Replicas in this process (not the total across processes, as in PopTorch)."""
        _check_count("replicationFactor", replication_factor)
        if self._under_poprun and replication_factor != self._replication_factor:
            count = self.Distributed.numProcesses
            raise LaunchConflict(
                f"replicationFactor({replication_factor}) contradicts the launch: poprun gave this instance "
                f"{self._replication_factor} local replica(s) ({self._replication_factor * count} replicas over "
                f"{count} instance(s)). Under poprun the replication factor comes from the environment; drop the "
                f"call, or relaunch with --num-replicas {replication_factor * count}"
            )
        self._replication_factor = replication_factor
        return self

    def deviceIterations(self, device_iterations: int) -> Options:
        """Weight updates per host call: a loader's item holds this many updates."""
        self._device_iterations = _check_count("deviceIterations", device_iterations)
        return self

    def randomSeed(self, random_seed: int) -> Options:
        """The seed every process shuffles with; it must be the same on all of them."""
        self._random_seed = _check_seed(random_seed)
        return self

    # -- what was set ----------------------------------------------------------------------------
    @property
    def replication_factor(self) -> int:
        return self._replication_factor

    @property
    def device_iterations(self) -> int:
        return self._device_iterations

    @property
    def random_seed(self) -> int | None:
        return self._random_seed

    @property
    def ipus_per_replica(self) -> int:
        return self._ipus_per_replica

    @property
    def total_replicas(self) -> int:
        """Replicas across all processes."""
        return self._replication_factor * self.Distributed.numProcesses

    def settings(self) -> ReplicaSettings:
        """A frozen snapshot of these options."""
        return ReplicaSettings.of(self)

    def __repr__(self) -> str:
        s = self.settings()
        return (f"Options(replicationFactor={s.replication_factor}, deviceIterations={s.device_iterations}, "
                f"gradientAccumulation={s.gradient_accumulation}, randomSeed={s.random_seed}, "
                f"processId={s.process_id}, numProcesses={s.num_processes}, under_poprun={self._under_poprun})")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(name: str, value: object) -> int:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value  # type: ignore[return-value]


def _check_seed(value: object) -> int:
    if not _is_int(value) or not 0 <= value < 2**64:  # type: ignore[operator]
        raise ValueError(f"randomSeed must be an integer in [0, 2**64), got {value!r}")
    return value  # type: ignore[return-value]


def _read_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
