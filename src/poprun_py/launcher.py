"""One launch end to end: ``LaunchSpec`` -> allocation -> plan -> job -> exit code.

This is where the outside world is consulted (the program on disk, a free
port, the executable cache directory, the remote hosts) before the pure
planning step. ``run_job`` is the machinery without the program:
``poprun_py.functions`` uses it to run Python functions in forked instances
(``JobOptions.spawn``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from popdist.env import CONSOLE_IS_TERMINAL, SOFT_DEFAULTS, FabricSettings
from simipu.fabric.join.rendezvous import RendezvousServer

from .console import ConsoleWatch
from .errors import UsageError
from .events import ConsoleClosed, EventQueue, StartupTimedOut, Stream
from .executors.descriptors import check_descriptor_limit
from .executors.guardian import Guardian
from .executors.local import LocalExecutor, Spawner, exec_program
from .hosts import HostSpec, distribute_instances
from .job import Job, JobReport, TimeLimit
from .output import OutputOptions, OutputRouter
from .plan import LOCALHOST, Allocation, Plan, make_plan, offline_allocation
from .programs import resolve_program
from .reach import Reach, check_working_dir, forwarded_environment, reach_hosts, with_allocation_hosts
from .report import log_report
from .spec import LaunchSpec
from .status import StatusLine

if TYPE_CHECKING:  # the V-IPU and device modules load only for launches that use IPUs
    from simipu.devices import Device

    from .executors.fanout import FanOutExecutor

log = logging.getLogger("poprun")


def free_port() -> int:
    """A TCP port for torch.distributed's store; instance 0 binds it (as torchrun does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prepare_cache(path: str | None) -> None:
    if path is None:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--executable-cache-path: cannot create {path!r}: {exc.strerror}") from None


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """How a job's instances start and are watched, beyond what the ``LaunchSpec`` says."""

    argv: tuple[str, ...]  # the program as found here; for forked functions, only a name for the logs
    spawn: Spawner = exec_program
    time_limit: TimeLimit | None = None
    status_line: bool = True  # the live status line (it still shows only on a terminal)


def build_plan(
    spec: LaunchSpec,
    argv: tuple[str, ...],
    environ: Mapping[str, str],
    allocation: Allocation,
    job_id: str,
    reach: Reach = Reach(),
    cwd: str | None = None,
    fabric: FabricSettings = FabricSettings(),
    device_fds: Mapping[int, tuple[int, ...]] = {},
    rendezvous: tuple[str, int] = ("127.0.0.1", 0),
) -> Plan:
    """The plan; instances on this host run ``argv``, the others the program as typed, found by their agent."""
    cwd = cwd or os.getcwd()
    _prepare_cache(spec.executable_cache_path)
    plan = make_plan(
        spec,
        argv=argv,
        job_id=job_id,
        allocation=allocation,
        master_port=free_port(),
        launcher_environ=environ,
        cwd=cwd,
        rendezvous=rendezvous,
        fabric=fabric,
        device_fds=device_fds,
        cpus=numa_binding(spec),
        addresses=reach.addresses,
        host_cpus=local_host_cpus(spec, reach),
    )
    if not reach.agents:
        return plan
    return dataclasses.replace(plan, instances=tuple(
        dataclasses.replace(i, argv=spec.program) if str(i.host) in reach.agents else i for i in plan.instances))


def local_host_cpus(spec: LaunchSpec, reach: Reach = Reach()) -> dict[str, int]:
    """The CPUs poprun may use, for each host whose instances start from here (agents count their own)."""
    cpus = len(os.sched_getaffinity(0))
    return {str(host): cpus for host in spec.hosts or (LOCALHOST,) if str(host) not in reach.agents}


def numa_wanted(spec: LaunchSpec) -> bool:
    """NUMA placement: asked for, or automatic with several instances per host; never when disabled."""
    per_host = spec.num_instances // max(1, len(spec.hosts))
    wanted = spec.numa_aware if spec.numa_aware is not None else per_host > 1
    return spec.process_placement != "disabled" and wanted


def numa_binding(spec: LaunchSpec) -> dict[int, tuple[int, ...]]:
    """CPUs per instance on this host (remote agents place their own instances on their own nodes)."""
    if not numa_wanted(spec):
        return {}
    per_host = spec.num_instances // max(1, len(spec.hosts))
    from .numa import local_placement

    try:
        placement = local_placement(per_host)
    except ValueError as exc:
        log.warning("NUMA placement is off: %s", exc)
        return {}
    return {index: placement[index % per_host][1] for index in range(spec.num_instances)}


def _detach_all(devices: Mapping[int, Device]) -> None:
    """Once the instances run they hold their devices' locks; poprun lets go of its copies."""
    for device in devices.values():
        device.detach()


def print_topology(spec: LaunchSpec, plan: Plan) -> None:
    from .ranges import format_cpus
    from .topology import render_topology  # only when asked: start-up time matters

    table = render_topology([str(h) for h in plan.hosts], spec.num_ilds, spec.num_instances, spec.num_replicas)
    lines = [table.rstrip("\n")]
    for instance in plan.instances:
        if instance.cpus is not None:
            lines.append(f"instance {instance.index} on {instance.host}: CPUs {format_cpus(instance.cpus)}")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def run_launch(spec: LaunchSpec) -> int:
    """Run a validated launch of a program; the exit code is the job's."""
    spec, via_srun = with_allocation_hosts(spec, os.environ)
    cwd = check_working_dir(spec, spec.hosts)
    argv = spec.program
    if not via_srun and (not spec.hosts or any(h.is_local for h in spec.hosts)):
        argv = (resolve_program(spec.program[0], os.environ, cwd), *spec.program[1:])  # before anything starts
    time_limit = TimeLimit(spec.timeout) if spec.timeout is not None else None
    report = run_job(spec, JobOptions(argv, time_limit=time_limit), cwd, via_srun)
    log_report(report)
    return report.exit_code


def run_job(spec: LaunchSpec, options: JobOptions, cwd: str | None = None, via_srun: bool = False) -> JobReport:
    """Reach the hosts, allocate (a V-IPU partition, or nothing offline), run the instances to the end, release."""
    cwd = cwd or os.getcwd()
    reach = reach_hosts(spec, cwd, via_srun)
    try:
        here = [host for host in _instance_hosts(spec) if str(host) not in reach.agents]
        check_descriptor_limit(len(here), spec.num_instances)  # before a partition or an instance
        launch = _Launch(spec, options, os.urandom(8).hex(), cwd, reach)  # the job id is an id, not a secret
        if spec.offline_mode:
            return _run_on(launch, offline_allocation(spec))
        return _run_on_partition(launch)
    finally:
        reach.close()


@dataclasses.dataclass(frozen=True)
class _Launch:
    spec: LaunchSpec
    options: JobOptions
    job_id: str
    cwd: str
    reach: Reach


def _run_on_partition(launch: _Launch) -> JobReport:
    from .partition import acquire_partition, attach_devices, release_partition

    lease = acquire_partition(launch.spec, launch.job_id)
    try:
        devices = attach_devices(launch.spec, lease, launch.job_id)
        try:
            return _run_on(launch, lease.allocation, devices)
        finally:
            _detach_all(devices)
    finally:
        release_partition(lease)


def _run_on(launch: _Launch, allocation: Allocation, devices: Mapping[int, Device] = {}) -> JobReport:
    spec = launch.spec
    events = EventQueue()
    token = os.urandom(32).hex()  # reaches instances through their environment only
    rendezvous = RendezvousServer(
        spec.num_instances,
        token.encode(),
        bind_host=launch.reach.rendezvous_bind,
        checkin_timeout=spec.startup_timeout,
        heartbeat_timeout=spec.fabric_timeout,
        on_timeout=lambda missing, message: events.put(StartupTimedOut(missing, message)),
    )
    try:
        return _run_with_rendezvous(launch, events, rendezvous, token, allocation, devices)
    finally:
        rendezvous.close()


def _executor(launch: _Launch, plan: Plan, events: EventQueue, environ: Mapping[str, str],
              guardian: Guardian) -> LocalExecutor | FanOutExecutor:
    console = {CONSOLE_IS_TERMINAL: "1" if sys.stdout.isatty() else "0"}  # instances' stdout is a pipe
    # Only poprun itself adopts orphans: a function launch runs in the caller's own process.
    adopt = launch.options.spawn is exec_program
    local = LocalExecutor(events, {**SOFT_DEFAULTS, **environ, **console}, guardian, launch.options.spawn, adopt)
    if not launch.reach.agents:
        return local
    # imported here: only launches with remote hosts need the agents' code
    from .executors.fanout import FanOutExecutor
    from .executors.remote import AgentExecutor

    spec = launch.spec
    base_env = {**forwarded_environment(environ, SOFT_DEFAULTS), **console}
    agents = {
        label: AgentExecutor(label, host.channel, events, base_env=base_env, grace=spec.stop_grace,
                             numa=numa_wanted(spec), start_timeout=spec.ssh_timeout)
        for label, host in launch.reach.agents.items()
    }
    return FanOutExecutor(local, agents)


def _run_with_rendezvous(
    launch: _Launch,
    events: EventQueue,
    rendezvous: RendezvousServer,
    token: str,
    allocation: Allocation,
    devices: Mapping[int, Device],
) -> JobReport:
    spec, options, environ = launch.spec, launch.options, dict(os.environ)
    fabric = FabricSettings(token, spec.fabric_transport, spec.fabric_timeout, spec.startup_timeout)
    here = {i for i, host in enumerate(_instance_hosts(spec)) if str(host) not in launch.reach.agents}
    handed = {index: device for index, device in devices.items() if index in here}  # the others stay with poprun
    device_fds = {index: device.handed_over() for index, device in handed.items()}
    address = (launch.reach.rendezvous_address, rendezvous.address[1])
    plan = build_plan(spec, options.argv, environ, allocation, launch.job_id, launch.reach, launch.cwd, fabric,
                      device_fds, address)
    if spec.print_topology or spec.verbosity >= 2:
        print_topology(spec, plan)
    log.info("Launching %d instances of %s (job %s)", spec.num_instances, " ".join(spec.program), plan.job_id)
    status = StatusLine(spec.num_instances, enabled=None if options.status_line else False)
    log.info("%s", describe_compat_imports(spec.compat_imports))
    router = _output_router(spec, events, on_console=status.console_wrote if status.enabled else None)
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

    guardian = Guardian(spec.stop_grace)
    try:
        executor = _executor(launch, plan, events, environ, guardian)
        return Job(executor, events, router, spec.num_instances, spec.stop_grace, status,
                   on_started=on_started, time_limit=options.time_limit).run(plan.instances)
    finally:
        for watch in console:
            watch.close()
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


def _output_router(spec: LaunchSpec, events: EventQueue,
                   on_console: Callable[[Stream, bytes], None] | None = None) -> OutputRouter:
    """The router; an output directory that cannot be made is the user's to fix (exit 2), not our bug."""
    options = OutputOptions(
        tag_output=spec.tag_output,
        timestamp_output=spec.timestamp_output,
        output_dir=Path(spec.output_filename) if spec.output_filename else None,
        only_instance=spec.only_output_from_instance,
    )
    try:
        return OutputRouter(options, spec.num_instances, on_console=on_console,
                            on_console_closed=lambda s: events.put(ConsoleClosed(s)))
    except OSError as exc:
        where = exc.filename or spec.output_filename
        raise UsageError(
            f"--output-filename {spec.output_filename}: cannot create {where}: {exc.strerror or exc}; "
            "choose a directory you can write to"
        ) from None


def _instance_hosts(spec: LaunchSpec) -> list[HostSpec]:
    """The host of each instance, in index order (contiguous blocks, as ``make_plan`` places them)."""
    hosts = spec.hosts or (LOCALHOST,)
    return [host for host, block in zip(hosts, distribute_instances(len(hosts), spec.num_instances)) for _ in block]
