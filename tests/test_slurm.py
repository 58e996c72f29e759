"""poprun inside a Slurm allocation, against a real single-node Slurm (tests/infra/slurm_cluster.py).

Inside ``salloc`` and without ``-H``, the allocation's nodes are the hosts
and poprun starts one agent per node with ``srun``; outside an allocation
none of this applies. Every process srun starts inherits the test's marker
(srun exports the caller's environment), so the leak check covers agents and
instances too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Iterator

import psutil
import pytest

from infra.slurm_cluster import SlurmCluster, unavailable_reason
from poprun_py.executors.slurm import allocation_hosts, tasks_per_node
from poprun_py.hosts import HostSpec
from poprun_py.reach import rendezvous_address
from support import RUN_TIMEOUT, Launch, assert_all_gone, pids_of, poprun_command, python_program, run_poprun

OFFLINE = "--offline-mode=1"


# -- reading the allocation (no Slurm needed) ----------------------------------------------------
def test_tasks_per_node_as_slurm_writes_them() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        tasks_per_node("2(x)")


def test_allocation_nodes_become_hosts_with_their_slots() -> None:
    hosts = allocation_hosts({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "pod[01-03],gw7",
                              "SLURM_TASKS_PER_NODE": "2(x3),1"})
    assert hosts == (HostSpec("pod01", slots=2), HostSpec("pod02", slots=2), HostSpec("pod03", slots=2),
                     HostSpec("gw7", slots=1))


def test_inside_a_step_the_slots_are_the_allocations_cpus_not_the_steps_tasks() -> None:
    """``srun -n1 poprun ...`` in a ``-n2`` allocation: Slurm sets the step's SLURM_TASKS_PER_NODE=1 there."""
    step = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "pod[01-02]", "SLURM_STEP_ID": "0",
            "SLURM_TASKS_PER_NODE": "1,0", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"}
    assert allocation_hosts(step) == (HostSpec("pod01", slots=2), HostSpec("pod02", slots=2))


def test_a_task_count_for_more_nodes_than_a_host_list_may_name_is_not_read_into_memory() -> None:
    """``2(x1000000000000)`` was a list of 10**12 counts: a MemoryError, poprun's exit 70 "internal error"."""
    with pytest.raises(ValueError, match="more than 65536 nodes"):
        tasks_per_node("1,2(x1000000000000)")
    environ = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "pod[01-02]",
               "SLURM_TASKS_PER_NODE": "2(x1000000000000)"}
    environ.pop("SLURM_STEP_ID", None)
    result = run_poprun(OFFLINE, "--dry-run=yes", "true", env=environ)
    assert result.returncode == 0, result.stderr  # unreadable counts: one slot per node, as for any other
    assert b"hosts: pod01 (reached by srun in this Slurm allocation)" in result.stdout


@pytest.mark.parametrize("towards, expected", [
    # inside Slurm the node poprun runs on has an agent too, reached over loopback: the other node's address wins
    ({"127.0.0.1", "192.168.1.5"}, ("192.168.1.5", "192.168.1.5")),
    ({"127.0.0.1"}, ("127.0.0.1", "127.0.0.1")),  # one node: loopback is all there is
    ({"127.0.0.1", "10.0.0.1", "192.168.0.1"}, ("10.0.0.1", "")),  # two networks: listen on all, answer with one
    ({"::1", "fd00::1"}, ("fd00::1", "fd00::1")),
])
def test_the_rendezvous_is_not_on_loopback_while_another_host_needs_it(towards: set[str],
                                                                        expected: tuple[str, str]) -> None:
    """Before, the lowest address won: 127.0.0.1 against 192.168.1.5, so the other node's instances were told
    to reach the rendezvous at their own loopback."""
    assert rendezvous_address(towards) == expected


# -- a real allocation ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no Slurm here: {reason} (scripts/test.sh installs it when run as root)")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def salloc(cluster: SlurmCluster, *poprun_args: str, tasks: int = 2, name: str = "poprun-test") -> list[str]:
    return ["salloc", "--quiet", "-N1", f"-n{tasks}", f"--job-name={name}", "--time=5", *poprun_command(*poprun_args)]


def run_in_allocation(cluster: SlurmCluster, *poprun_args: str, tasks: int = 2) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(salloc(cluster, *poprun_args, tasks=tasks), capture_output=True,
                          env=cluster.command_env(), timeout=RUN_TIMEOUT)


def test_instances_run_in_srun_steps_on_the_allocation_nodes(slurm: SlurmCluster) -> None:
    """Each instance sees itself as a task of the launch in the user's job (before: every instance had the agent
    step's SLURM_PROCID=0, SLURM_NTASKS=1 and SLURM_JOB_NAME=poprun-agent, so Slurm-aware code saw rank 0 of 1)."""
    result = run_in_allocation(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "4",
                               *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    seen = sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda d: d["api"]["instance"])
    assert [d["api"]["instance"] for d in seen] == [0, 1]
    for d in seen:
        env, index = d["env"], d["api"]["instance"]
        assert env["POPRUN_HOST"] == slurm.node_name and "SLURM_STEP_ID" in env  # inside an srun step
        assert d["api"]["local_instance"] == index
        assert env["SLURM_JOB_NAME"] == "poprun-test"
        assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == (str(index), str(index), "0")
        assert (env["SLURM_NTASKS"], env["SLURM_NPROCS"], env["SLURM_TASKS_PER_NODE"]) == ("2", "2", "2")
    assert seen[0]["env"]["SLURM_STEP_ID"] == seen[1]["env"]["SLURM_STEP_ID"]  # one agent per node


def test_poprun_in_a_one_task_step_of_a_two_task_allocation_is_not_oversubscribed(slurm: SlurmCluster) -> None:
    """``srun -n1 poprun`` (as a batch script's step): before, poprun read the step's one task as the node's
    slots and warned that its 2 instances oversubscribed the node."""
    argv = salloc(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "2", *python_program("collectives_check.py"))
    at = argv.index("--time=5") + 1
    result = subprocess.run([*argv[:at], "srun", "-n1", "--quiet", *argv[at:]], capture_output=True,
                            env=slurm.command_env(), timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert b"oversubscribed" not in result.stderr, result.stderr


def test_collectives_inside_an_allocation(slurm: SlurmCluster) -> None:
    result = run_in_allocation(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                               *python_program("collectives_check.py"))
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_failure_inside_an_allocation_is_named(slurm: SlurmCluster) -> None:
    result = run_in_allocation(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "2", "--stop-grace", "2",
                               *python_program("behave.py", "--fail", "1", "exit3", "--others", "sleep"))
    assert result.returncode == 3, result.stderr
    stderr = result.stderr.decode()
    assert "instance 1 of 2" in stderr and slurm.node_name in stderr and "exited with code 3" in stderr


def test_sigkill_of_poprun_inside_an_allocation_leaves_nothing(slurm: SlurmCluster) -> None:
    launch = Launch(argv=salloc(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                                     *python_program("behave.py", "--ready", "--others", "sleep")),
                    env=slurm.command_env())
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    (poprun,) = [p for p in psutil.Process(launch.process.pid).children() if "poprun_py" in " ".join(p.cmdline())]
    poprun.send_signal(signal.SIGKILL)
    launch.finish()
    assert_all_gone(pids)


def test_scancel_signal_usr1_reaches_every_instance_and_the_job_goes_on(slurm: SlurmCluster) -> None:
    """Slurm's "checkpoint now" (``scancel --signal=USR1``, ``--signal=USR1@120``) signals the job's steps: poprun's
    agents. Each passes it on to its instances, as poprun does. Before, the agent died of it: "lost ...: User
    defined signal 1", exit 1, and no instance saw it."""
    env = slurm.command_env()
    launch = Launch(argv=salloc(slurm, OFFLINE, "--num-instances", "2", "--num-replicas", "2",
                                *python_program("behave.py", "--ready", "--others", "signals")), env=env)
    pids = pids_of(launch.wait_for_lines(b"ready", 2))
    (job,) = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, env=env, timeout=RUN_TIMEOUT,
                            check=True).stdout.split()
    for signum in ("USR1", "USR2"):
        subprocess.run(["scancel", f"--signal={signum}", job.decode()], env=env, timeout=RUN_TIMEOUT, check=True)
        got = sorted(launch.wait_for_lines(b"instance", 2))
        assert got == [f"instance {i} got SIG{signum}\n".encode() for i in range(2)], (got, launch.stderr)
    (poprun,) = [p for p in psutil.Process(launch.process.pid).children() if "poprun_py" in " ".join(p.cmdline())]
    poprun.send_signal(signal.SIGQUIT)  # (the job ends as the local test's: each instance exits 0 on SIGQUIT)
    assert launch.finish() == 128 + signal.SIGQUIT, launch.stderr
    assert b"lost" not in launch.stderr, launch.stderr
    assert_all_gone(pids)


def test_hosts_given_with_h_win_over_the_allocation(slurm: SlurmCluster) -> None:
    result = run_in_allocation(slurm, OFFLINE, "-H", "localhost", "--num-instances", "2", "--num-replicas", "2",
                               *python_program("print_env.py"))
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        assert "SLURM_STEP_ID" not in json.loads(line)["env"]  # spawned directly, no srun
