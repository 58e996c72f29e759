"""One launch end to end: ``LaunchSpec`` -> allocation -> plan -> job -> exit code.

This is where the outside world is consulted (the program on disk, a free
port, the executable cache directory) before the pure planning step.
``run_job`` is the machinery without the program: ``poprun_py.functions``
uses it to run Python functions in forked instances (``JobOptions.spawn``).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from popdist.env import SOFT_DEFAULTS, FabricSettings
from simipu.fabric.rendezvous import RendezvousServer

from .errors import ProgramNotExecutable, ProgramNotFound, Unsupported, UsageError
from .events import EventQueue, StartupTimedOut
from .executors.guardian import Guardian
from .executors.local import LocalExecutor, Spawner, exec_program
from .job import Job, JobReport, TimeLimit
from .output import OutputOptions, OutputRouter
from .plan import Allocation, Plan, make_plan, offline_allocation
from .report import log_report
from .spec import LaunchSpec
from .status import StatusLine

if TYPE_CHECKING:  # the V-IPU and device modules load only for launches that use IPUs
    from simipu.devices import Device

log = logging.getLogger("poprun")


def resolve_program(name: str, environ: Mapping[str, str], cwd: str) -> str:
    """The program as the OS will run it; like mpirun, one in the current directory needs no ``./``."""
    if os.sep in name:
        path = Path(cwd, name)
        if not path.exists():
            raise ProgramNotFound(f"program {name!r} not found")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise ProgramNotExecutable(f"program {name!r} is not executable (chmod +x, or run it with its interpreter)")
        return name
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    if found:
        return found
    local = Path(cwd, name)
    if local.is_file():
        if not os.access(local, os.X_OK):
            raise ProgramNotExecutable(f"program {name!r} in the current directory is not executable (chmod +x)")
        return str(local)
    raise ProgramNotFound(f"program {name!r} not found in PATH or the current directory")


def free_port() -> int:
    """A TCP port for torch.distributed's store; instance 0 binds it (as torchrun does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_hosts(spec: LaunchSpec) -> None:
    remote = [str(h) for h in spec.hosts if not h.is_local]
    if remote:
        raise Unsupported(
            f"cannot launch on remote hosts ({', '.join(remote)}): this poprun-py has no SSH support yet; "
            "use -H localhost or leave out -H"
        )


def _prepare_cache(path: str | None) -> None:
    if path is None:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--executable-cache-path: cannot create {path!r}: {exc.strerror}") from None


@dataclass(frozen=True)
class JobOptions:
    """How a job's instances start and are watched, beyond what the ``LaunchSpec`` says."""

    argv: tuple[str, ...]  # the program as resolved; for forked functions, only a name for the logs
    spawn: Spawner = exec_program
    time_limit: TimeLimit | None = None
    status_line: bool = True  # the live status line (it still shows only on a terminal)


def build_plan(
    spec: LaunchSpec,
    argv: tuple[str, ...],
    environ: Mapping[str, str],
    cwd: str,
    allocation: Allocation,
    job_id: str,
    rendezvous: tuple[str, int] = ("127.0.0.1", 0),
    fabric: FabricSettings = FabricSettings(),
    device_fds: Mapping[int, tuple[int, ...]] = {},
) -> Plan:
    _prepare_cache(spec.executable_cache_path)
    return make_plan(
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
    )


def numa_binding(spec: LaunchSpec) -> dict[int, tuple[int, ...]]:
    """CPUs per instance when NUMA placement is on: asked for, or automatic with several instances per host."""
    per_host = spec.num_instances // max(1, len(spec.hosts))
    wanted = spec.numa_aware if spec.numa_aware is not None else per_host > 1
    if spec.process_placement == "disabled" or not wanted:
        return {}
    from .numa import local_placement

    try:
        placement = local_placement(per_host)
    except ValueError as exc:
        log.warning("NUMA placement is off: %s", exc)
        return {}
    return {index: placement[index % per_host][1] for index in range(spec.num_instances)}


def _detach_all(devices: Mapping[int, "Device"]) -> None:
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
    """Run a validated launch of a program on this host; the exit code is the job's."""
    check_hosts(spec)  # an unsupported launch says so before anything else is looked at
    program = resolve_program(spec.program[0], os.environ, os.getcwd())  # before any partition is created
    report = run_job(spec, JobOptions((program, *spec.program[1:])))
    log_report(report)
    return report.exit_code


def run_job(spec: LaunchSpec, options: JobOptions) -> JobReport:
    """Allocate (a V-IPU partition, or nothing offline), run the instances to the end, release."""
    check_hosts(spec)
    job_id = os.urandom(8).hex()  # an id, not a secret
    if spec.offline_mode:
        return _run_on(spec, options, offline_allocation(spec), job_id)
    from .partition import acquire_partition, attach_devices, release_partition

    lease = acquire_partition(spec, job_id)
    try:
        devices = attach_devices(spec, lease, job_id)
        try:
            return _run_on(spec, options, lease.allocation, job_id, devices)
        finally:
            _detach_all(devices)
    finally:
        release_partition(lease)


def _run_on(
    spec: LaunchSpec, options: JobOptions, allocation: Allocation, job_id: str, devices: Mapping[int, "Device"] = {}
) -> JobReport:
    environ = dict(os.environ)
    events = EventQueue()
    token = os.urandom(32).hex()  # reaches instances through their environment only
    rendezvous = RendezvousServer(
        spec.num_instances,
        token.encode(),
        bind_host="127.0.0.1",
        checkin_timeout=spec.startup_timeout,
        heartbeat_timeout=spec.fabric_timeout,
        on_timeout=lambda missing, message: events.put(StartupTimedOut(missing, message)),
    )
    try:
        return _run_with_rendezvous(spec, options, environ, events, rendezvous, token, allocation, job_id, devices)
    finally:
        rendezvous.close()


def _run_with_rendezvous(
    spec: LaunchSpec,
    options: JobOptions,
    environ: dict[str, str],
    events: EventQueue,
    rendezvous: RendezvousServer,
    token: str,
    allocation: Allocation,
    job_id: str,
    devices: Mapping[int, "Device"],
) -> JobReport:
    fabric = FabricSettings(token, spec.fabric_transport, spec.fabric_timeout, spec.startup_timeout)
    device_fds = {index: device.handed_over() for index, device in devices.items()}
    plan = build_plan(spec, options.argv, environ, os.getcwd(), allocation, job_id, rendezvous.address, fabric, device_fds)
    if spec.print_topology or spec.verbosity >= 2:
        print_topology(spec, plan)
    log.info("Launching %d instances of %s (job %s)", spec.num_instances, " ".join(spec.program), plan.job_id)
    router = OutputRouter(
        OutputOptions(
            tag_output=spec.tag_output,
            timestamp_output=spec.timestamp_output,
            output_dir=Path(spec.output_filename) if spec.output_filename else None,
            only_instance=spec.only_output_from_instance,
        ),
        spec.num_instances,
    )
    status = StatusLine(spec.num_instances, enabled=None if options.status_line else False)
    log_filter = status.log_filter()
    for handler in logging.getLogger("poprun").handlers:
        handler.addFilter(log_filter)

    def on_started() -> None:
        # Serving starts once every instance exists: a forked instance must not inherit a
        # thread of ours halfway through something (instances wait in the listen backlog).
        rendezvous.start()
        _detach_all(devices)

    guardian = Guardian(spec.stop_grace)
    try:
        executor = LocalExecutor(events, {**SOFT_DEFAULTS, **environ}, guardian, options.spawn)
        return Job(executor, events, router, spec.num_instances, spec.stop_grace, status,
                   on_started=on_started, time_limit=options.time_limit).run(plan.instances)
    finally:
        guardian.close()
        for handler in logging.getLogger("poprun").handlers:
            handler.removeFilter(log_filter)
