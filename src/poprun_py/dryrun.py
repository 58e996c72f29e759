"""``--dry-run``: the launch resolved as far as it goes without starting or creating anything.

Hosts (``-H``, ``--host-file`` or the Slurm allocation), the program as found
here, the placement and CPUs, and the partition poprun would ask the V-IPU
service for; then each instance's command, directory and the environment
poprun gives it, with secrets masked. No SSH connection, no agent, no
partition, no process: what needs those is named as decided at launch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
from typing import Iterable, Iterator, Mapping

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
from .hosts import HostSpec
from .mpiargs import shell_word
from .plan import Allocation, InstancePlan, Programs, offline_allocation, plan_hosts, plan_instances
from .planning import find_programs, local_host_cpus, numa_binding
from .ranges import format_cpus
from .reach import base_environment, check_working_dir, with_allocation_hosts
from .spec import LaunchSpec
from .writers import write_own_lines

MASK = "********"
#: Names whose values are never printed: the job token and anything that looks like a secret.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|(^|_)KEY($|_)|APIKEY|AUTH", re.IGNORECASE)
#: Values poprun picks only when it launches (whether its stdout is a terminal: the launch's, not the listing's).
_AT_LAUNCH = {MASTER_PORT, RENDEZVOUS_PORT, JOB_ID, TORCHELASTIC_RUN_ID, CONSOLE_IS_TERMINAL}
_PLACEHOLDER_PORT = 1  # any port: make_plan leaves a port of 0 out, and the real ones are picked at launch


@functools.lru_cache(maxsize=4096)  # each instance of a dry run asks of the same few dozen names
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

    Each instance is planned and listed before the next (``plan_instances``, ``write_own_lines``): a million
    instances take a million instances' time but one chunk's memory. Never cut silently: ``poprun --dry-run
    ... > plan.txt`` on a full disk is exit 80 and says how much was lost, and ``| head`` is 141.
    """
    placement, via_srun = with_allocation_hosts(spec.placement, os.environ)
    spec = dataclasses.replace(spec, placement=placement)
    cwd = check_working_dir(spec.reach, placement.hosts)
    found = {} if via_srun else find_programs(spec.program, placement, spec.instance, os.environ, cwd)
    remote = frozenset(str(h) for h in placement.hosts if via_srun or not h.is_local)  # their agent finds the program
    allocation, partition = _partition(spec)
    instances = plan_instances(placement, spec.instance, programs=Programs(spec.program, spec.program, remote, found),
                               job_id="dry-run", allocation=allocation, master_port=_PLACEHOLDER_PORT,
                               rendezvous=("127.0.0.1", _PLACEHOLDER_PORT), launcher_environ=os.environ, cwd=cwd,
                               fabric=dataclasses.replace(spec.fabric, token="dry-run"),
                               cpus=numa_binding(placement, remote), host_cpus=local_host_cpus(placement, remote))
    if via_srun:
        from .executors.slurm import TaskVariables

        instances = map(TaskVariables(placement.blocks(), os.environ).add_to, instances)
    write_own_lines(1, _lines(spec, plan_hosts(placement), instances, via_srun, partition))
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


def _lines(spec: LaunchSpec, hosts: tuple[HostSpec, ...], instances: Iterable[InstancePlan], via_srun: bool,
           partition: str) -> Iterator[str]:
    """The listing, line by line: what the whole launch would be, then each instance as it is planned."""
    placement = spec.placement
    if via_srun:
        reached = "reached by srun in this Slurm allocation"
    elif all(h.is_local for h in hosts):
        reached = "this host"
    else:
        reached = "reached by SSH, except this host"
    yield "poprun --dry-run: nothing was started and no partition was created"
    yield f"hosts: {', '.join(str(h) for h in hosts)} ({reached})"
    yield f"partition: {partition}"
    yield (f"instances: {placement.num_instances}, replicas: {placement.num_replicas} "
           f"({placement.replicas_per_instance} per instance), IPUs per replica: {placement.ipus_per_replica}")
    if spec.supervision.timeout is not None:
        yield f"time limit: {spec.supervision.timeout:g}s"
    additions = {here: executor_additions(here, os.environ) for here in {not via_srun and h.is_local for h in hosts}}
    for instance in instances:
        yield from _instance_lines(spec, instance, via_srun is False and instance.host.is_local, additions)


def _instance_lines(spec: LaunchSpec, instance: InstancePlan, here: bool,
                    additions: Mapping[bool, Mapping[str, str]]) -> Iterator[str]:
    """One instance's lines: its host, command, directory, CPUs and environment (secrets masked)."""
    yield f"instance {instance.index} on {instance.host}:"
    yield f"  command: {shlex.join(instance.argv)}" + ("" if here else " (found there by poprun's agent)")
    yield f"  cwd: {instance.cwd}"
    if instance.cpus is not None:
        yield f"  cpus: {format_cpus(instance.cpus)}"
    elif spec.placement.numa_aware and not here:
        yield "  cpus: placed on that host's NUMA nodes by its agent"
    yield "  env (besides poprun's own environment):" if here else "  env:"
    env = {**additions[here], **instance.env}
    for name, value in sorted(env.items()):
        yield f"    {name}={shown_value(name, shell_word(value), spec.offline_mode)}"
