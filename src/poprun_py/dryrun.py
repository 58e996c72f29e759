"""``--dry-run``: the launch resolved as far as it goes without starting or creating anything.

Hosts (``-H``, ``--host-file`` or the Slurm allocation), the program as found
here, the placement and CPUs, and the partition poprun would ask the V-IPU
service for; then each instance's command, directory and the environment
poprun gives it, with secrets masked. No SSH connection, no agent, no
partition, no process: what needs those is named as decided at launch.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Mapping

from popdist.env import (
    CONSOLE_IS_TERMINAL,
    JOB_ID,
    JOB_TOKEN,
    MASTER_PORT,
    NODE_DEVICE_ID,
    RENDEZVOUS_PORT,
    TORCHELASTIC_RUN_ID,
)

from .executors.guardian import MARKER_VARIABLE
from .mpiargs import shell_word
from .plan import Allocation, Plan, Programs, make_plan, offline_allocation
from .planning import find_programs, local_host_cpus, numa_binding
from .ranges import format_cpus
from .reach import base_environment, check_working_dir, with_allocation_hosts
from .spec import LaunchSpec
from .writers import write_own_output

MASK = "********"
#: Names whose values are never printed: the job token and anything that looks like a secret.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|(^|_)KEY($|_)|APIKEY|AUTH", re.IGNORECASE)
#: Values poprun picks only when it launches (whether its stdout is a terminal: the launch's, not the listing's).
_AT_LAUNCH = {MASTER_PORT, RENDEZVOUS_PORT, JOB_ID, TORCHELASTIC_RUN_ID, CONSOLE_IS_TERMINAL}
_PLACEHOLDER_PORT = 1  # any port: make_plan leaves a port of 0 out, and the real ones are picked at launch


def is_secret(name: str) -> bool:
    return name == JOB_TOKEN or name == MARKER_VARIABLE or bool(_SECRET_NAME.search(name))


def executor_additions(here: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """What the launch adds to an instance's environment besides its plan's (which wins): its base
    (``reach.base_environment``; on this host, what poprun's own environment lacks, and whether the console is
    a terminal) and the guardian's token (a secret, masked)."""
    base = base_environment(here, environ, console_is_terminal=False)
    if here:
        base = {k: v for k, v in base.items() if k not in environ or k == CONSOLE_IS_TERMINAL}
    return {**base, MARKER_VARIABLE: "dry-run"}


def shown_value(name: str, value: str, offline: bool = True) -> str:
    if is_secret(name):
        return MASK
    at_launch = name in _AT_LAUNCH or (name == NODE_DEVICE_ID and not offline)  # the partition's device
    return "(chosen at launch)" if at_launch else value


def dry_run(spec: LaunchSpec) -> int:
    """Print what the launch would run, where and with what; start nothing. Exit code 0.

    Written whole or not at all silently (``write_own_output``): ``poprun --dry-run ... > plan.txt`` on a
    full disk is exit 80, and ``| head`` 141.
    """
    placement, via_srun = with_allocation_hosts(spec.placement, os.environ)
    spec = dataclasses.replace(spec, placement=placement)
    cwd = check_working_dir(spec.reach, placement.hosts)
    found = {} if via_srun else find_programs(spec.program, placement, spec.instance, os.environ, cwd)
    remote = frozenset(str(h) for h in placement.hosts if via_srun or not h.is_local)  # their agent finds the program
    allocation, partition = _partition(spec)
    plan = make_plan(placement, spec.instance, programs=Programs(spec.program, spec.program, remote, found), job_id="dry-run",
                     allocation=allocation, master_port=_PLACEHOLDER_PORT,
                     rendezvous=("127.0.0.1", _PLACEHOLDER_PORT), launcher_environ=os.environ, cwd=cwd,
                     fabric=dataclasses.replace(spec.fabric, token="dry-run"),
                     cpus=numa_binding(placement, remote), host_cpus=local_host_cpus(placement, remote))
    if via_srun:
        from .executors.slurm import with_task_variables

        plan = with_task_variables(plan, os.environ)
    write_own_output(1, "\n".join(_lines(spec, plan, via_srun, partition)) + "\n")
    return 0


def _partition(spec: LaunchSpec) -> tuple[Allocation, str]:
    """The allocation instances would be told about, and a line saying which partition it would be."""
    vipu = spec.vipu
    if spec.offline_mode:
        return offline_allocation(spec.placement, vipu), "none (--offline-mode: no IPUs attached)"
    from .partition import partition_request, vipu_errors

    name = vipu.partition or "poprun-JOBID"  # the job id's first 8 hex digits, at launch
    with vipu_errors():  # a size V-IPU refuses: the launch's line and exit code, not a crash
        request = partition_request(spec.placement, vipu, name)
    what = (f"{request.size} IPUs, {request.num_gcds} GCDs, {request.num_ilds} ILDs, "
            f"IPU-Link routing {request.resolved_ipu_link_routing_type()}, "
            f"GW-Link routing {request.resolved_gw_link_routing_type()}, sync type {request.resolved_sync_type()}")
    where = f" in cluster {request.cluster}" if request.cluster else ""
    host = f"[{vipu.server_host}]" if ":" in (vipu.server_host or "") else vipu.server_host  # IPv6: [addr]:port
    server = f"{host}:{vipu.server_port}" if vipu.server_host else "the embedded V-IPU service"
    if vipu.partition:
        line = f"{name} from {server}: used if it exists and fits, created otherwise ({what}{where})"
    else:
        removed = ", removed after the run" if vipu.remove_partition else ""
        line = (f"the only fitting partition of {server}, else a new one {name} ({what}{where}{removed})")
    allocation = Allocation(partition=name, node_device_id=0, server_host=vipu.server_host or "",
                            server_port=vipu.server_port, server_timeout=vipu.server_timeout,
                            gateway_mode=True, offline=False)
    return allocation, line


def _lines(spec: LaunchSpec, plan: Plan, via_srun: bool, partition: str) -> list[str]:
    placement = spec.placement
    if via_srun:
        reached = "reached by srun in this Slurm allocation"
    elif all(h.is_local for h in plan.hosts):
        reached = "this host"
    else:
        reached = "reached by SSH, except this host"
    lines = [
        "poprun --dry-run: nothing was started and no partition was created",
        f"hosts: {', '.join(str(h) for h in plan.hosts)} ({reached})",
        f"partition: {partition}",
        f"instances: {placement.num_instances}, replicas: {placement.num_replicas} "
        f"({placement.replicas_per_instance} per instance), IPUs per replica: {placement.ipus_per_replica}",
    ]
    if spec.supervision.timeout is not None:
        lines.append(f"time limit: {spec.supervision.timeout:g}s")
    for instance in plan.instances:
        here = via_srun is False and instance.host.is_local
        lines.append(f"instance {instance.index} on {instance.host}:")
        lines.append(f"  command: {shlex.join(instance.argv)}" + ("" if here else " (found there by poprun's agent)"))
        lines.append(f"  cwd: {instance.cwd}")
        if instance.cpus is not None:
            lines.append(f"  cpus: {format_cpus(instance.cpus)}")
        elif placement.numa_aware and not here:
            lines.append("  cpus: placed on that host's NUMA nodes by its agent")
        lines.append("  env (besides poprun's own environment):" if here else "  env:")
        env = {**executor_additions(here, os.environ), **instance.env}
        lines.extend(f"    {name}={shown_value(name, shell_word(v), spec.offline_mode)}" for name, v in _sorted(env))
    return lines


def _sorted(env: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted(env.items())
