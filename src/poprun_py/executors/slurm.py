"""Inside a Slurm allocation: the allocation's nodes are the hosts, and srun starts their agents.

No SSH is needed: for each node poprun runs one ``srun`` step (one task,
``--overlap`` so it shares the allocation with others) whose stdin and
stdout are the agent's channel, binary-safe. Every node, this one included,
is reached the same way, so every instance is inside a Slurm step and is
accounted and cleaned up by Slurm as well as by the agent.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ..errors import UsageError
from ..hosts import MAX_HOSTS, HostListError, HostSpec, parse_host_list
from ..plan import InstancePlan, Plan
from .channels import PipeChannel
from .greeting import HostCheckFailed, agent_script, greet, verdict_error

log = logging.getLogger("poprun.slurm")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(text: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS.match(part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM_TASKS_PER_NODE={text!r}")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:  # (not read into memory: "2(x1000000000000)" was a MemoryError)
            raise ValueError(f"SLURM_TASKS_PER_NODE={text!r} counts more than {MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def allocation_hosts(environ: Mapping[str, str]) -> tuple[HostSpec, ...]:
    """The allocation's nodes, with their task counts as slots; inside a step (``srun -n1 poprun ...``), where
    Slurm's task counts are the step's (1 for ``srun -n1``, which made 2 instances in a ``-n2`` allocation look
    oversubscribed), the allocation's CPUs per node."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    try:
        nodes = parse_host_list(nodelist)
    except HostListError as exc:
        raise UsageError(f"cannot read the Slurm node list SLURM_JOB_NODELIST={nodelist!r}: {exc}") from None
    counts = "SLURM_JOB_CPUS_PER_NODE" if environ.get("SLURM_STEP_ID") else "SLURM_TASKS_PER_NODE"
    try:
        slots = tasks_per_node(environ.get(counts, ""))
    except ValueError:
        slots = []
    if len(slots) != len(nodes):
        slots = [1] * len(nodes)
    return tuple(replace(node, slots=count) for node, count in zip(nodes, slots))


def compress_counts(counts: Sequence[int]) -> str:
    """The inverse of ``tasks_per_node``: [2, 2, 1] -> ``2(x2),1``, as Slurm writes them."""
    parts: list[str] = []
    run = 0
    for position, count in enumerate(counts):
        run += 1
        if position + 1 == len(counts) or counts[position + 1] != count:
            parts.append(f"{count}(x{run})" if run > 1 else str(count))
            run = 0
    return ",".join(parts)


class TaskVariables:
    """Each instance's Slurm variables as if one ``srun`` step of the instances had started them: its own
    SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID, the launch's task counts, and the job's name as poprun saw it
    (not those of the one-task agent step it really runs in, which would make every instance rank 0 of 1 in a
    job named poprun-agent for Slurm-aware code).

    Made from each host's instances (``Placement.blocks``; hosts are never repeated), so that ``--dry-run``
    adds them one instance at a time; a host's SLURM_GTIDS is joined once, for its first instance.
    """

    def __init__(self, blocks: Sequence[tuple[HostSpec, Sequence[int]]], environ: Mapping[str, str]) -> None:
        per_host = [len(block) for _, block in blocks]
        tasks = str(sum(per_host))
        self._shared = {"SLURM_NTASKS": tasks, "SLURM_NPROCS": tasks, "SLURM_TASKS_PER_NODE": compress_counts(per_host),
                        "SLURM_STEP_NUM_TASKS": tasks, "SLURM_STEP_TASKS_PER_NODE": compress_counts(per_host),
                        "SLURM_STEP_NUM_NODES": str(len(blocks)),
                        "SLURM_STEP_NODELIST": ",".join(host.name for host, _ in blocks)}
        if "SLURM_JOB_NAME" in environ:
            self._shared["SLURM_JOB_NAME"] = environ["SLURM_JOB_NAME"]
        self._nodes = {host: (node, block) for node, (host, block) in enumerate(blocks)}
        self._gtids: tuple[HostSpec | None, str] = (None, "")

    def add_to(self, instance: InstancePlan) -> InstancePlan:
        node, block = self._nodes[instance.host]
        if self._gtids[0] != instance.host:  # a host's instances come together: one host's list is kept
            self._gtids = (instance.host, ",".join(str(index) for index in block))
        own = {"SLURM_PROCID": str(instance.index), "SLURM_LOCALID": str(instance.local_index),
               "SLURM_NODEID": str(node), "SLURM_GTIDS": self._gtids[1]}
        return replace(instance, env=MappingProxyType({**self._shared, **own, **instance.env}))  # poprun's, -x's win


def with_task_variables(plan: Plan, environ: Mapping[str, str]) -> Plan:
    """The plan with each instance's Slurm variables (``TaskVariables``)."""
    on_host: dict[HostSpec, list[int]] = {host: [] for host in plan.hosts}
    for instance in plan.instances:
        on_host[instance.host].append(instance.index)
    tasks = TaskVariables([(host, on_host[host]) for host in plan.hosts], environ)
    return replace(plan, instances=tuple(tasks.add_to(instance) for instance in plan.instances))


@dataclass(eq=False)
class SrunHost:
    """A node with its agent, started by srun and greeted."""

    label: str
    channel: PipeChannel
    hello: Mapping[str, Any]
    address: str
    local_address: str

    def close(self) -> None:
        self.channel.close()


def srun_command(node: str, python: str, cwd: str) -> list[str]:
    """One task on ``node`` sharing the allocation; ``--unbuffered`` because slurmstepd otherwise holds
    output back until a newline, and frames are binary (stdin and stdout stay plain pipes, no pty)."""
    srun = shutil.which("srun")
    if srun is None:
        raise UsageError("inside a Slurm allocation but srun is not on PATH; "
                         "load Slurm's environment, or choose hosts with -H")
    return [srun, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--quiet", "--unbuffered",
            "--kill-on-bad-exit=1", "--cpu-bind=none", "--input=all", "--job-name=poprun-agent",
            "sh", "-c", agent_script(python, cwd)]


def address_towards(node: str) -> str:
    """This host's address on its route to ``node``: the one ``node`` reaches us by, for the rendezvous. (A UDP
    socket's connect picks the route and sends nothing.) This host's name, where the kernel has no route. Not
    the name alone: a name Debian maps to 127.0.1.1 in /etc/hosts would have the rendezvous listen on loopback
    only, where no other node can reach it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(node, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def start_agents(hosts: Sequence[HostSpec], *, python: str, cwd: str, timeout: float) -> dict[str, SrunHost]:
    """One srun step per node, all started at once, each greeted within ``timeout``."""
    deadline = time.monotonic() + timeout
    started: list[tuple[HostSpec, PipeChannel]] = []
    for host in hosts:
        process = subprocess.Popen(srun_command(host.name, python, cwd), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        started.append((host, PipeChannel(process, str(host))))
    reached: dict[str, SrunHost] = {}
    failed: list[tuple[str, HostCheckFailed]] = []
    for host, channel in started:
        try:
            hello = greet(channel, python, cwd, deadline)
        except HostCheckFailed as exc:
            failed.append((str(host), exc))
            channel.close()
            continue
        reached[str(host)] = SrunHost(str(host), channel, hello, host.name, address_towards(host.name))
    if failed:
        for started_host in reached.values():
            started_host.close()
        raise verdict_error("Slurm nodes could not start their agents", failed, len(hosts))
    log.debug("agents started by srun on %s", ", ".join(reached))
    return reached
