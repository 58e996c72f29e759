"""One launch end to end, a line of stages, each value produced once and handed on.

1. spec: ``spec.build_spec`` -> ``LaunchSpec``, one small record per stage (``records``);
2. placement: ``reach.with_allocation_hosts`` (``Placement``: the Slurm allocation's
   nodes) and ``reach.reach_hosts`` (``ReachSettings`` -> ``Reach``: the agents);
3. allocation: ``partition.acquire_partition`` (``Placement``, ``VipuSettings`` ->
   ``Allocation`` and devices) or ``plan.offline_allocation``;
4. plan: ``planning.plan_job`` (a port, CPUs, the cache directory) -> ``plan.make_plan``
   (``Placement``, ``InstanceSettings``, ``Allocation`` -> ``Plan``);
5. job: ``job.Job`` runs ``Plan.instances`` (``Supervision``, ``OutputSettings``) ->
   ``JobReport``;
6. report: ``report.log_report`` -> the exit code.

``run_job`` is the machinery without the program: ``poprun_py.functions``
uses it to run Python functions in forked instances (``JobOptions.spawn``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple

from simipu.fabric.join.rendezvous import RendezvousServer

from .console import ConsoleWatch
from .errors import UsageError
from .events import ConsoleClosed, EventQueue, PeerGone, StartupTimedOut, Stream
from .executors.descriptors import check_descriptor_limit
from .executors.guardian import Guardian
from .executors.local import LocalExecutor, Spawner
from .job import Job, TimeLimit
from .output import OutputOptions, OutputRouter
from .plan import Allocation, Plan, Programs, offline_allocation
from .planning import find_programs, plan_job
from .programs import exec_program
from .reach import Reach, base_environment, check_working_dir, reach_hosts, with_allocation_hosts
from .records import OutputSettings
from .report import JobReport, log_report
from .spec import LaunchSpec
from .status import StatusLine

if TYPE_CHECKING:  # the V-IPU and device modules load only for launches that use IPUs
    from simipu.devices import Device

    from .executors.fanout import FanOutExecutor

log = logging.getLogger("poprun")


class JobOptions(NamedTuple):
    """How a job's instances start and are watched, beyond what the ``LaunchSpec`` says. (This and ``_Launch``
    are named tuples, not frozen dataclasses: their classes are made at every launch, about 6x faster.)"""

    argv: tuple[str, ...]  # the program as found here; for forked functions, only a name for the logs
    spawn: Spawner = exec_program
    time_limit: TimeLimit | None = None
    status_line: bool = True  # the live status line (it still shows only on a terminal)
    guardian: Guardian | None = None  # one started by the caller (who closes it); else the job starts its own
    found: Mapping[int, tuple[str, ...]] = MappingProxyType({})  # each local instance's program


def _detach_all(devices: Mapping[int, Device]) -> None:
    """Once the instances run they hold their devices' locks; poprun lets go of its copies."""
    for device in devices.values():
        device.detach()


def run_launch(spec: LaunchSpec, guardian: Guardian | None = None) -> int:
    """Run a validated launch of a program; the exit code is the job's.

    ``guardian``: one the caller started early and closes (see ``command._launch``).
    """
    placement, via_srun = with_allocation_hosts(spec.placement, os.environ)
    spec = dataclasses.replace(spec, placement=placement)
    cwd = check_working_dir(spec.reach, placement.hosts)
    found = {} if via_srun else find_programs(spec.program, placement, spec.instance, os.environ, cwd)
    limit = spec.supervision.timeout
    time_limit = TimeLimit(limit) if limit is not None else None
    options = JobOptions(next(iter(found.values()), spec.program), time_limit=time_limit, guardian=guardian,
                         found=found)
    report = run_job(spec, options, cwd, via_srun)
    log_report(report)
    return report.exit_code


def run_job(spec: LaunchSpec, options: JobOptions, cwd: str | None = None, via_srun: bool = False) -> JobReport:
    """Reach the hosts, allocate (a V-IPU partition, or nothing offline), run the instances to the end, release."""
    cwd = cwd or os.getcwd()
    reach = reach_hosts(spec.placement.hosts, spec.reach, cwd, via_srun)
    try:
        launch = _Launch(spec, options, os.urandom(8).hex(), cwd, reach)  # the job id is an id, not a secret
        check_descriptor_limit(len(launch.instances_here()), spec.placement.num_instances)  # before a partition
        if spec.offline_mode:
            return _run_on(launch, offline_allocation(spec.placement, spec.vipu))
        return _run_on_partition(launch)
    finally:
        reach.close()


class _Launch(NamedTuple):
    spec: LaunchSpec
    options: JobOptions
    job_id: str
    cwd: str
    reach: Reach

    def instances_here(self) -> set[int]:
        """The instances poprun starts itself (the others, their hosts' agents)."""
        hosts = self.spec.placement.instance_hosts()
        return {index for index, host in enumerate(hosts) if str(host) not in self.reach.agents}

    def programs(self) -> Programs:
        return Programs(self.options.argv, self.spec.program, frozenset(self.reach.agents), self.options.found)


def _run_on_partition(launch: _Launch) -> JobReport:
    from .partition import acquire_partition, attach_devices, release_partition

    placement = launch.spec.placement
    lease = acquire_partition(placement, launch.spec.vipu, launch.job_id)
    try:
        devices = attach_devices(placement, lease, launch.job_id)
        try:
            return _run_on(launch, lease.allocation, devices)
        finally:
            _detach_all(devices)
    finally:
        release_partition(lease)


def _run_on(launch: _Launch, allocation: Allocation, devices: Mapping[int, Device] = {}) -> JobReport:
    fabric = launch.spec.fabric
    events = EventQueue()
    token = os.urandom(32).hex()  # reaches instances through their environment only
    rendezvous = RendezvousServer(
        launch.spec.placement.num_instances,
        token.encode(),
        bind_host=launch.reach.rendezvous_bind,
        checkin_timeout=fabric.startup_timeout,
        heartbeat_timeout=fabric.timeout,
        on_timeout=lambda missing, message: events.put(StartupTimedOut(missing, message)),
        on_gone=lambda instance: events.put(PeerGone(instance)),
    )
    try:
        return _run_with_rendezvous(launch, events, rendezvous, token, allocation, devices)
    finally:
        rendezvous.close()


def _executor(launch: _Launch, plan: Plan, events: EventQueue, environ: Mapping[str, str],
              guardian: Guardian) -> LocalExecutor | FanOutExecutor:
    terminal = sys.stdout.isatty()
    # Only poprun itself adopts orphans: a function launch runs in the caller's own process.
    adopt = launch.options.spawn is exec_program
    local = LocalExecutor(events, base_environment(True, environ, terminal), guardian, launch.options.spawn, adopt)
    if not launch.reach.agents:
        return local
    # imported here: only launches with remote hosts need the agents' code
    from .executors.fanout import FanOutExecutor
    from .executors.remote import AgentExecutor

    spec = launch.spec
    base_env = base_environment(False, environ, terminal)
    agents = {
        label: AgentExecutor(label, host.channel, events, base_env=base_env, grace=spec.supervision.stop_grace,
                             numa=spec.placement.numa_wanted, start_timeout=spec.reach.ssh_timeout,
                             unit=spec.placement.bind_unit, overload=spec.placement.bind_overload)
        for label, host in launch.reach.agents.items()
    }
    return FanOutExecutor(local, agents)


def _plan(launch: _Launch, token: str, allocation: Allocation, device_fds: Mapping[int, tuple[int, ...]],
          rendezvous_port: int) -> Plan:
    spec, reach = launch.spec, launch.reach
    plan = plan_job(spec.placement, spec.instance, launch.programs(), job_id=launch.job_id, allocation=allocation,
                    fabric=dataclasses.replace(spec.fabric, token=token),
                    rendezvous=(reach.rendezvous_address, rendezvous_port), cwd=launch.cwd, environ=os.environ,
                    addresses=reach.addresses, device_fds=device_fds)
    if not reach.via_srun:
        return plan
    from .executors.slurm import with_task_variables

    return with_task_variables(plan, os.environ)


def _run_with_rendezvous(
    launch: _Launch,
    events: EventQueue,
    rendezvous: RendezvousServer,
    token: str,
    allocation: Allocation,
    devices: Mapping[int, Device],
) -> JobReport:
    spec, options, environ = launch.spec, launch.options, dict(os.environ)
    num_instances, grace = spec.placement.num_instances, spec.supervision.stop_grace
    here = launch.instances_here()
    handed = {index: device for index, device in devices.items() if index in here}  # the others stay with poprun
    plan = _plan(launch, token, allocation, {index: device.handed_over() for index, device in handed.items()},
                 rendezvous.address[1])
    if spec.output.show_topology:
        from .topology import print_plan_topology  # only when asked: start-up time matters

        print_plan_topology(plan, spec.placement)
    log.info("Launching %d instances of %s (job %s)", num_instances, " ".join(spec.program), plan.job_id)
    status = StatusLine(num_instances, enabled=None if options.status_line else False)
    log.info("%s", describe_compat_imports(spec.instance.compat_imports))
    router = _output_router(spec.output, num_instances, events,
                            on_console=status.console_wrote if status.enabled else None)
    log_filter = status.log_filter()
    for handler in logging.getLogger("poprun").handlers:
        handler.addFilter(log_filter)
    console: list[ConsoleWatch] = []

    def on_started() -> None:
        # Serving starts once every instance exists: a forked instance must not inherit a
        # thread of ours halfway through something (instances wait in the listen backlog).
        rendezvous.start()
        _detach_all(handed)
        console.append(ConsoleWatch(lambda stream: events.put(ConsoleClosed(stream))))  # the same holds for it

    guardian = options.guardian or Guardian(grace)
    try:
        executor = _executor(launch, plan, events, environ, guardian)
        rendezvous.alive_here = executor.alive_here  # (before it starts serving: ``on_started``)
        rendezvous.stopped_here = executor.stopped_here
        return Job(executor, events, router, num_instances, grace, status,
                   on_started=on_started, time_limit=options.time_limit,
                   on_clean_exit=rendezvous.instance_exited).run(plan.instances)
    finally:
        for watch in console:
            watch.close()
        if guardian is not options.guardian:
            guardian.close()
        for handler in logging.getLogger("poprun").handlers:
            handler.removeFilter(log_filter)


def describe_compat_imports(enabled: bool) -> str:
    """What ``import horovod`` / ``import mpi4py`` give the instances' Python programs (for ``-v``)."""
    if enabled:
        return ("Python programs: horovod and mpi4py resolve to poprun-py's (popdist.horovod, popdist.mpi4py) "
                "through poprun_py_hook.pth; --compat-imports=no turns this off")
    return ("Python programs: horovod and mpi4py are the installed packages (--compat-imports=no); a real MPI "
            "that sees fewer processes than instances stops the program")


def _output_router(settings: OutputSettings, num_instances: int, events: EventQueue,
                   on_console: Callable[[Stream, bytes], None] | None = None) -> OutputRouter:
    """The router; an output directory that cannot be made is the user's to fix (exit 2), not our bug."""
    options = OutputOptions(
        tag_output=settings.tag_output,
        timestamp_output=settings.timestamp_output,
        output_dir=settings.output_filename or None,
        only_instance=settings.only_instance,
        console_copy=not settings.output_nocopy,
        merge_stderr=settings.merge_stderr,
    )
    try:
        return OutputRouter(options, num_instances, on_console=on_console,
                            on_console_closed=lambda s: events.put(ConsoleClosed(s)))
    except OSError as exc:
        where = exc.filename or settings.output_filename
        raise UsageError(
            f"--output-filename {settings.output_filename}: cannot create {where}: {exc.strerror or exc}; "
            "choose a directory you can write to"
        ) from None
