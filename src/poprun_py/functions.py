"""Run a Python function in N fake instances: ``poprun_py.launch(fn, *args, num_instances=4)``.

The launch is poprun's own (``launcher.run_job``): the same plan and
environment per instance, the job's rendezvous (so collectives work), the
supervisor (first failure stops the rest), the guardian (no orphans, even if
the caller is SIGKILLed). Only the spawner differs: each instance is a fork
of the caller running the function (``executors.forked``). Each instance
leaves its outcome, pickled, in a memfd of its own; when a time limit stops
the job, faulthandler writes the stacks of every instance still running into
a second one on SIGUSR1, then the instance dies of that signal.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Sequence

from popdist.env import FabricSettings
from simipu.hardware import is_power_of_two

from .executors.forked import ForkSpawner
from .failures import SKIP, XFAIL, InstanceFailure, InstancesFailed, RemoteError, describe_exception
from .job import TimeLimit
from .launcher import JobOptions, run_job
from .plan import InstancePlan
from .records import InstanceSettings, OutputSettings, Placement, ReachSettings, Supervision, VipuSettings
from .report import JobReport, describe_failure
from .spec import LaunchSpec
from .validate import MAX_SECONDS, check_launch, too_many_ipus

log = logging.getLogger("poprun.functions")

Describe = Callable[[BaseException], RemoteError]
#: Where an instance comes from, for the logs: forks of this process.
HOST = "localhost"


@dataclass(frozen=True)
class FunctionLaunch:
    """How many instances, replicas and IPUs a function runs on, and for how long at most."""

    num_instances: int = 1
    num_replicas: int | None = None  # None: one replica per instance
    ipus_per_replica: int = 1
    offline: bool = True  # False: simulated IPUs from the V-IPU service, as poprun without --offline-mode
    timeout: float | None = None  # seconds, start-up included; None: no limit

    def __post_init__(self) -> None:
        for name in ("num_instances", "num_replicas", "ipus_per_replica"):
            value = getattr(self, name)
            if value is None and name == "num_replicas":
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be a whole number, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.replicas % self.num_instances:
            raise ValueError(f"num_replicas={self.replicas} cannot be divided evenly among "
                             f"num_instances={self.num_instances}; use a multiple of {self.num_instances}")
        if not isinstance(self.offline, bool):
            raise TypeError(f"offline must be True or False, got {self.offline!r}")
        if self.timeout is not None:
            if not isinstance(self.timeout, (int, float)) or isinstance(self.timeout, bool):
                raise TypeError(f"timeout must be a number of seconds or None, got {self.timeout!r}")
            if not 0 < self.timeout <= MAX_SECONDS:  # nan and inf too: a deadline must be one the OS can wait for
                raise ValueError(f"timeout must be more than 0 seconds and at most {MAX_SECONDS:.0f}, "
                                 f"got {self.timeout!r}")
        self._check_ipus()

    def _check_ipus(self) -> None:
        """The IPUs asked for, checked here rather than when the launch starts: the marker's arguments are
        checked before the test's fixtures are set up, and a mistake is one line in the user's own words."""
        placement = Placement(self.num_instances, self.replicas, self.ipus_per_replica)
        problem = too_many_ipus(placement, _as_keyword)
        if problem:
            raise ValueError(problem)
        if not self.offline and not is_power_of_two(placement.num_ipus):
            raise ValueError(f"with offline=False the IPUs come from a V-IPU partition, whose size must be a power "
                             f"of two: {_as_keyword('num_replicas', self.replicas)} x "
                             f"{_as_keyword('ipus_per_replica', self.ipus_per_replica)} is {placement.num_ipus} IPUs; "
                             "ask for 1, 2, 4, 8, ... IPUs, or use offline=True")

    @property
    def replicas(self) -> int:
        return self.num_instances if self.num_replicas is None else self.num_replicas

    def spec(self, name: str) -> LaunchSpec:
        """The ``LaunchSpec`` of this launch: poprun's defaults, output tagged (as ``--tag-output``)."""
        spec = LaunchSpec(
            program=(name,),
            placement=Placement(self.num_instances, self.replicas, self.ipus_per_replica),
            vipu=VipuSettings(),
            offline_mode=self.offline,
            instance=InstanceSettings(),
            output=OutputSettings(tag_output=True),
            fabric=FabricSettings(),
            supervision=Supervision(timeout=self.timeout),
            reach=ReachSettings(),
        )
        check_launch(spec, os.environ)  # the rest of the bounds poprun's own options meet (the exec size)
        return spec


def _as_keyword(name: str, value: object) -> str:
    """An option as ``launch()`` and the marker take it: ``num_replicas=8``."""
    return f"{name}={value}"


def launch(
    fn: Callable[..., Any],
    /,
    *args: Any,
    num_instances: int = 1,
    num_replicas: int | None = None,
    ipus_per_replica: int = 1,
    offline: bool = True,
    timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` in every instance of a poprun job; the results in instance order.

    Each instance is a fork of the calling process (start method: ``os.fork``),
    so functions defined in a test module, closures and lambdas work and their
    arguments are not pickled; only the results come back, pickled (they must
    be picklable). Each instance has the full PopDist environment, so
    ``popdist.getInstanceIndex()`` and ``popdist.collectives`` work inside.
    Its output reaches this process's stdout/stderr tagged ``[1,i]<stdout>:``.
    Caveats of fork apply: threads of the caller do not exist in the
    instances, and NumPy's global random state is the same in all of them.

    If any instance fails, the others are stopped and ``InstancesFailed`` is
    raised with every failed instance's traceback, the first failure first.
    After ``timeout`` seconds, every instance still running dumps its stacks
    (faulthandler) into that exception and is stopped.
    """
    return run_function(fn, args, kwargs, FunctionLaunch(num_instances, num_replicas, ipus_per_replica, offline, timeout))


def run_function(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    settings: FunctionLaunch,
    describe: Describe = describe_exception,
    name: str | None = None,
) -> list[Any]:
    """``launch`` with the settings as a value, a choice of how exceptions are described
    (the pytest plugin renders them as pytest would), and a name for the logs."""
    if not callable(fn):
        raise TypeError(f"launch() needs a callable to run in the instances, got {fn!r}")
    name = name or getattr(fn, "__qualname__", None) or repr(fn)
    spec = settings.spec(name)
    _preload()
    channels = [_Channel(index) for index in range(settings.num_instances)]
    try:
        body = _InstanceBody(fn, tuple(args), dict(kwargs), channels, describe)
        limit = TimeLimit(settings.timeout, signal.SIGUSR1) if settings.timeout is not None else None
        report = run_job(spec, JobOptions((name,), ForkSpawner(body), limit, status_line=False))
        outcomes = [channel.read_outcome() for channel in channels]
        if report.exit_code == 0 and all(o is not None and o.error is None for o in outcomes):
            return [o.value for o in outcomes]  # type: ignore[union-attr]
        if report.stopped_by_signal is not None:
            signal.raise_signal(report.stopped_by_signal)  # Ctrl-C: KeyboardInterrupt, now that all are stopped
        raise _instances_failed(report, outcomes, [_trim_stacks(channel.read_stacks()) for channel in channels])
    finally:
        for channel in channels:
            channel.close()


def _preload() -> None:
    """Import what collectives need here, once, rather than in every instance after the fork."""
    import numpy  # noqa: F401

    import simipu.fabric.connect  # noqa: F401


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    error: RemoteError | None = None


class _Channel:
    """Where one instance leaves its outcome and, if stopped for time, its stacks: two memfds."""

    def __init__(self, index: int) -> None:
        self.result = os.memfd_create(f"poprun-result-{index}", os.MFD_CLOEXEC)
        self.stacks = os.memfd_create(f"poprun-stacks-{index}", os.MFD_CLOEXEC)

    def write(self, outcome: _Outcome) -> bool:
        """In the instance; False when the result could not be pickled (an error outcome is left instead)."""
        try:
            data = pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL)
            sent = True
        except Exception as exc:
            error = RemoteError(type(exc).__name__, f"the function's result cannot be sent back: {exc}",
                                f"the function returned {type(outcome.value).__name__!s}, which cannot be pickled: {exc}")
            data, sent = pickle.dumps(_Outcome(error=error)), False
        view = memoryview(data)
        while view:
            view = view[os.write(self.result, view):]
        return sent

    def read_outcome(self) -> _Outcome | None:
        data = _read_all(self.result)
        return pickle.loads(data) if data else None

    def read_stacks(self) -> str:
        return _read_all(self.stacks).decode("utf-8", "replace")

    def close(self) -> None:
        for fd in (self.result, self.stacks):
            try:
                os.close(fd)
            except OSError:
                pass


def _read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


class _InstanceBody:
    """What each forked instance runs: the function, then its outcome into the channel; the exit code."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, channels: list[_Channel],
                 describe: Describe) -> None:
        self._call = (fn, args, kwargs)
        self._channels = channels
        self._describe = describe

    def __call__(self, plan: InstancePlan) -> int:
        channel = self._channels[plan.index]
        for other in self._channels:
            if other is not channel:
                other.close()
        # On SIGUSR1 (the time limit): dump every thread's stack, then die of the signal (chain to SIG_DFL).
        faulthandler.register(signal.SIGUSR1, file=channel.stacks, all_threads=True, chain=True)
        _install_import_hook()
        code, outcome = self._run(os.getpid())
        _finalize_popdist()
        return code if channel.write(outcome) else 1

    def _run(self, instance_pid: int) -> tuple[int, _Outcome]:
        fn, args, kwargs = self._call
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            if os.getpid() != instance_pid:
                _end_forked_child(exc)
            return self._failed(exc)
        if os.getpid() != instance_pid:
            _end_forked_child(None)
        return 0, _Outcome(result)

    def _failed(self, exc: BaseException) -> tuple[int, _Outcome]:
        if isinstance(exc, SystemExit) and (exc.code is None or exc.code == 0):
            return 0, _Outcome(None)
        error = self._describe(_without_this_frame(exc))
        # pytest.skip()/xfail() end the instance with code 0: not a failure, so the supervisor does not stop
        # the others, and a failure of theirs is not hidden by it (it wins in _instances_failed).
        return (0 if error.outcome in (SKIP, XFAIL) else _exit_code(exc)), _Outcome(error=error)


def _exit_code(exc: BaseException) -> int:
    """The code Python exits with when ``exc`` ends the program."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _end_forked_child(exc: BaseException | None) -> NoReturn:
    """A process the function forked has left it (returned or raised): it ends as a forked Python program
    would, its error on its stderr, its code its own. It is not the instance: its outcome is not the
    instance's (before, the first written won: a child's ``sys.exit(0)`` made the instance's result None),
    and it leaves the fabric's connections, shared with the instance, alone."""
    code = 0
    if exc is not None:
        code = _exit_code(exc)
        if isinstance(exc, SystemExit):
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        else:
            traceback.print_exception(type(exc), exc, _without_this_frame(exc).__traceback__)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _install_import_hook() -> None:
    """``import horovod``/``mpi4py`` in the function get poprun-py's, as in a program poprun starts: there the
    hook ran at interpreter start-up (poprun_py_hook.pth); a fork starts with the caller's imports, so it
    runs now, with the instance's environment in place."""
    import _poprun_py_hook

    _poprun_py_hook.install()


def _without_this_frame(exc: BaseException) -> BaseException:
    """The traceback from the user's function down: ``_run``'s own frame is noise."""
    tb = exc.__traceback__
    return exc.with_traceback(tb.tb_next) if tb is not None and tb.tb_next is not None else exc


def _trim_stacks(text: str) -> str:
    """faulthandler's dump without the frames below ``_run``: the fork inherited the launcher's stack."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) or not line.strip():
            skipping = False
        elif skipping:
            continue
        elif line.startswith(f'  File "{__file__}"') and line.endswith(" in _run"):
            skipping = True
            continue
        kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


def _finalize_popdist() -> None:
    """Leave the fabric cleanly (``os._exit`` skips atexit), so peers do not see a lost instance."""
    if "popdist.core" not in sys.modules:
        return
    try:
        sys.modules["popdist.core"].finalizeBackend()
    except Exception:
        log.debug("finalising popdist failed", exc_info=True)


def _how_it_ended(error: RemoteError | None) -> str:
    """How an instance the supervisor saw end well (code 0) ended without a result."""
    if error is None:
        return "exited with code 0 before returning a result"
    if error.outcome in (SKIP, XFAIL):
        return f"{'skipped' if error.outcome == SKIP else 'xfailed'}: {error.message}"
    return f"raised {error.summary}"


def _instances_failed(report: JobReport, outcomes: list[_Outcome | None], stacks: list[str]) -> InstancesFailed:
    """The first failure first, then the others in the order they ended; the stopped ones apart."""
    n = report.num_instances
    timed_out = report.timed_out is not None
    failures: list[InstanceFailure] = []
    stopped: list[int] = []
    seen: set[int] = set()
    ended = [f for f in (report.first_failure, *report.knock_ons) if f is not None]
    if timed_out:  # they were all stopped at once: index order reads better than the order they died in
        ended.sort(key=lambda f: f.instance)
    for failure in ended:
        index = failure.instance
        seen.add(index)
        outcome = outcomes[index]
        error = outcome.error if outcome is not None else None
        hung = timed_out and index in report.signalled and error is None
        if error is None and not hung and index in report.signalled:
            stopped.append(index)
            continue
        if error is not None:
            how = f"raised {error.summary}"
        elif hung:
            how = "timed out" if stacks[index] else "timed out (no stacks: it did not answer SIGUSR1)"
        else:
            how = describe_failure(failure)
        failures.append(InstanceFailure(index, n, failure.host, failure.pid, how, error,
                                        stacks[index] if hung and stacks[index] else None,
                                        failure.stderr_tail if error is None and not hung else ()))
    for index, outcome in enumerate(outcomes):
        if index in seen or (outcome is not None and outcome.error is None):
            continue
        error = outcome.error if outcome is not None else None
        failures.append(InstanceFailure(index, n, HOST, report.pids.get(index), _how_it_ended(error), error))
    failures.sort(key=lambda failure: failure.skipped)  # a failure wins over a skip: it comes first
    note = None
    if report.startup_timeout is not None:
        note = f"start-up timed out: {report.startup_timeout.message}"
    elif report.unreaped:
        note = f"instances {', '.join(map(str, report.unreaped))} could not be reaped"
    return InstancesFailed(tuple(failures), tuple(sorted(stopped)), n,
                           report.timed_out.seconds if report.timed_out is not None else None, note)
