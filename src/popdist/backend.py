"""This process's link to the job's fabric: made by ``init()``, used by the collectives.

Under poprun with more than one instance, ``init()`` checks in with the
launcher's rendezvous and connects to every peer; with one instance, or
outside poprun, a ``LoneFabric`` gives the same results without any socket.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

from popdist.env import InstanceEnv
from popdist.env_names import JOB_TOKEN

if TYPE_CHECKING:  # numpy is imported when a collective runs, not with popdist
    import numpy as np

logger = logging.getLogger(__name__)


class Collectives(Protocol):
    """What the instance-level collectives need of a fabric."""

    instance: int
    num_instances: int

    def allreduce(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray: ...
    def broadcast(self, array: np.ndarray, root: int = 0, group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray: ...
    def allgather(self, array: np.ndarray, group: Sequence[int] | None = None,
                  out: np.ndarray | None = None) -> np.ndarray: ...
    def reduce_scatter(self, array: np.ndarray, op: str = "sum", group: Sequence[int] | None = None) -> np.ndarray: ...
    def barrier(self, group: Sequence[int] | None = None) -> None: ...
    def send(self, array: np.ndarray, dest: int) -> None: ...
    def recv(self, like: np.ndarray, source: int, out: np.ndarray | None = None) -> np.ndarray: ...
    def message_waiting(self, sources: Sequence[int], block: bool = False, watched: Sequence[int] = (),
                        called: str | None = None) -> int | None: ...
    def take_waiting(self, source: int) -> bytearray: ...
    def close(self, why: str = "closed") -> None: ...


class LoneFabric:
    """One instance alone: every collective is a copy (the mean of one array is itself)."""

    instance = 0
    num_instances = 1

    def allreduce(self, array, op="sum", group=None, out=None):
        import numpy as np

        array = np.asarray(array)  # (not ascontiguousarray, which makes a 0-d array 1-d; copy() is C-ordered)
        if array.dtype.kind == "c" and op in ("max", "min"):  # (refused as the fabric refuses it)
            from simipu.fabric.algorithms.calls import unordered

            raise TypeError(unordered(op, array.dtype))
        if op == "mean" and not np.issubdtype(array.dtype, np.floating):
            array = array / 1
        return _filled(out, array)

    def broadcast(self, array, root=0, group=None, out=None):
        import numpy as np

        if root != 0:
            raise ValueError(f"broadcast root {root} does not exist: there is 1 instance")
        return _filled(out, np.ascontiguousarray(array))

    def allgather(self, array, group=None, out=None):
        import numpy as np

        return _filled(out, np.ascontiguousarray(array)[np.newaxis])

    def reduce_scatter(self, array, op="sum", group=None):
        return self.allreduce(array, op)

    def barrier(self, group=None):
        return None

    def send(self, array, dest):
        raise ValueError(f"instance {dest} does not exist: there is 1 instance")

    def recv(self, like, source, out=None):
        return self.send(like, source)

    def message_waiting(self, sources, block=False, watched=(), called=None):
        raise ValueError(f"instance {sources[0]} does not exist: there is 1 instance")

    def take_waiting(self, source):
        raise ValueError(f"instance {source} does not exist: there is 1 instance")

    def close(self, why: str = "closed") -> None:
        return None


class _InstanceGroup(threading.local):
    """The instances this thread's collectives span (None: all), set by ``instance_group``."""

    members: tuple[int, ...] | None = None  # (a class default: reading it costs no AttributeError per call)


class _Backend:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.initialised = False
        #: Initialised by a collective (or ``import mpi4py``), not by the program's ``popdist.init()``: the
        #: program may still call that once, as with Graphcore's PopDist, where the others do not initialise it.
        self.implicitly = False
        self.fabric: Collectives | None = None
        self.device: object | None = None  # a simipu Device held for the life of the process
        self.groups = _InstanceGroup()
        #: The fabric's plans that ``popdist.collectives`` calls itself, a frame nearer than ``Fabric.allreduce``
        #: (``simipu.fabric.planned.PlannedPaths.hot_allreduces``): empty without them; the fabric empties them when
        #: it breaks or closes.
        self.hot_allreduces: dict = {}
        self.hot_copies: dict = {}
        #: How many threads are inside ``instance_group`` now: while any is, every collective reads its thread's
        #: ``groups.members`` (a thread-local's attribute costs a hot call four plain ones).
        self.grouped = 0
        #: In a process forked from an instance: (the job's fabric token, the instance's pid), set at the fork.
        self.forked_from: tuple[str, int] | None = None


_backend = _Backend()


def _forget_after_fork() -> None:
    """A forked child is not its parent's instance: it starts uninitialised, with a fresh lock.

    The parent's fabric and device stay the parent's; the child never closes them
    (closing would tell the rendezvous that the parent left). ``poprun_py.launch``
    relies on this: its instances are forks of the caller.

    The child notes the job it was forked in (its fabric token, from the environment it inherited) and the
    instance's pid (kept through forks of forks): while its environment still names that job, it is a fork
    of the instance, not a member of the fabric, and ``initialise`` refuses it at once. A ``launch()``
    instance replaces its environment with its own job's (another token) before it runs, so it can join.
    """
    inherited = _backend.forked_from
    token = os.environ.get(JOB_TOKEN)
    _backend.__init__()  # type: ignore[misc]  # in place: core.py holds a reference to it
    if token:
        same_job = inherited is not None and inherited[0] == token
        _backend.forked_from = inherited if same_job else (token, os.getppid())


def _refuse_a_fork(launch: InstanceEnv | None) -> None:
    """Raise ``ForkedProcessError`` in a fork of an instance whose launch has a fabric to join: the rendezvous
    would refuse a second check-in of the instance's index (a misleading error, and a warning in poprun's log
    that reads like an intruder)."""
    forked = _backend.forked_from
    if forked is None or launch is None or launch.num_instances == 1 or launch.fabric.token != forked[0]:
        return
    from simipu.fabric.errors import ForkedProcessError

    raise ForkedProcessError(f"collectives cannot be used in a process forked from instance {launch.instance_index} "
                             f"(pid {forked[1]}): call them from the instance's own process")


os.register_at_fork(after_in_child=_forget_after_fork)


def _close_in_owner(fabric: Collectives, owner: int) -> None:
    """At exit: leave the fabric. A mismatch found only now (a peer's frame of a call we made, never taken: see
    ``Fabric.close``) ends the instance with code 1, as if its last call had raised: an exception in an
    ``atexit`` handler is printed but leaves the code 0, and the program must not look as if it succeeded."""
    if os.getpid() != owner:  # an atexit handler inherited by a fork must not close the parent's fabric
        return
    from simipu.fabric.errors import FabricError  # (loaded with the fabric)

    try:
        fabric.close(why="exited")
    except FabricError as error:
        logger.error("%s: %s", type(error).__name__, error)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)


def connect(launch: InstanceEnv | None) -> Collectives:
    """The fabric for this launch (blocking until every instance has checked in)."""
    if launch is None or launch.num_instances == 1 or not launch.fabric.token:
        return LoneFabric()
    from simipu.fabric.connect import connect as connect_fabric  # numpy and sockets only when needed

    settings = launch.fabric
    fabric = connect_fabric(
        (launch.rendezvous_addr, launch.rendezvous_port),
        settings.token.encode(),
        job_id=launch.job_id,
        instance=launch.instance_index,
        num_instances=launch.num_instances,
        transport=settings.transport,
        timeout=settings.timeout,
        startup_timeout=settings.startup_timeout,
        host_label=launch.host_label or None,
        bind_host=launch.fabric_addr,
    )
    atexit.register(_close_in_owner, fabric, os.getpid())
    return fabric


def adopt_device(launch: InstanceEnv | None) -> object | None:
    """Hold the device poprun attached for this instance (its IPU locks came with the process)."""
    if launch is None or launch.offline or not launch.device_fds:
        return None
    from simipu.devices import adopt

    return adopt(launch.device_fds, launch.device_id, launch.vipu_partition, job=launch.job_id)


def held_device(launch: InstanceEnv | None) -> object | None:
    """The device this instance holds, adopted now if ``init()`` has not yet (None offline or outside poprun)."""
    with _backend.lock:
        if _backend.device is None:
            _backend.device = adopt_device(launch)
        return _backend.device


def initialise(implicitly: bool = False) -> None:
    """``popdist.init()``: adopt this instance's device and connect the fabric, for the launch in
    ``os.environ`` (here, beside the state it sets, so that the first collective can call it too:
    ``implicitly``, after which the program's own ``init()`` finds everything done)."""
    with _backend.lock:
        if _backend.initialised and _backend.implicitly and not implicitly:
            _backend.implicitly = False
            return
        if _backend.initialised:
            raise RuntimeError(
                "popdist is already initialised; call popdist.finalizeBackend() "
                "first to initialise it again"
            )
        launch = InstanceEnv.from_environ(os.environ)
        _refuse_a_fork(launch)
        _backend.device = _backend.device or adopt_device(launch)  # popdist.popart.getDevice may have
        _backend.fabric = connect(launch)
        _backend.hot_allreduces = getattr(_backend.fabric, "hot_allreduces", {})
        _backend.hot_copies = getattr(_backend.fabric, "hot_copies", {})
        _backend.initialised, _backend.implicitly = True, implicitly
    if launch is None:
        logger.debug("popdist initialised outside poprun (single instance)")
    else:
        logger.debug("popdist initialised: instance %d of %d",
                     launch.instance_index, launch.num_instances)


def _filled(out, result):
    """A copy of ``result`` in native byte order, as the fabric's results are, or ``out`` filled with it
    (checked as the fabric checks it; alone, a wrong one raises at once: no peer waits)."""
    native = result.dtype.newbyteorder("=")
    if out is None:
        return result.astype(native, order="C")
    from simipu.fabric.algorithms.outputs import out_problem

    problem = out_problem(out, result.shape, native)
    if problem:
        raise ValueError(problem)
    out[...] = result
    return out


def current_fabric() -> Collectives:
    """The initialised fabric; the first collective initialises PopDist if nobody has."""
    fabric = _backend.fabric
    if fabric is None:
        with _backend.lock:
            already = _backend.initialised
        if not already:
            initialise(implicitly=True)
        fabric = _backend.fabric
        assert fabric is not None
    return fabric


def fabric_place() -> tuple[int, int]:
    """(this instance's index, the job's instance count): the fabric's once there is one, else the environment's
    (read and checked whole on each call: 30 us, which a caller asking once a message, as mpi4py's, cannot pay)."""
    fabric = _backend.fabric
    if fabric is not None:
        return fabric.instance, fabric.num_instances
    launch = InstanceEnv.from_environ(os.environ)  # (``core.getInstanceIndex`` and ``getNumInstances``' reading)
    return (0, 1) if launch is None else (launch.instance_index, launch.num_instances)


def current_group() -> tuple[int, ...] | None:
    return _backend.groups.members


@contextmanager
def instance_group(members: tuple[int, ...]) -> Iterator[None]:
    """Collectives inside span only ``members`` (used by execute_on_instances)."""
    previous = current_group()
    _backend.groups.members = members
    with _backend.lock:
        _backend.grouped += 1
    try:
        yield
    finally:
        _backend.groups.members = previous
        with _backend.lock:
            _backend.grouped -= 1
