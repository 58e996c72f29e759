"""The launch as a line of stages: the records a LaunchSpec is made of, each stage given only its own.

Pure: no process starts here (the launches themselves are in test_launch.py, test_ssh.py, test_slurm.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from popdist import env
from poprun_py.errors import UsageError
from poprun_py.functions import FunctionLaunch
from poprun_py.hosts import HostSpec
from poprun_py.plan import Programs, make_plan, offline_allocation
from poprun_py.spec import build_spec


def test_the_plan_places_instances_where_the_placement_says() -> None:
    spec = build_spec({"offline_mode": "yes", "num_instances": 6, "num_replicas": 6, "host": ["a,b,c"]}, ["p"])
    plan = make_plan(spec.placement, spec.instance, programs=Programs(("p",)), job_id="j",
                     allocation=offline_allocation(spec.placement, spec.vipu), master_port=1,
                     launcher_environ={}, cwd="/")
    assert [i.host for i in plan.instances] == spec.placement.instance_hosts()
    assert [str(h) for h in spec.placement.instance_hosts()] == ["a", "a", "b", "b", "c", "c"]
    assert [i.local_index for i in plan.instances] == [0, 1, 0, 1, 0, 1]
    # torchrun's node rank and count: the host's index, the number of hosts
    assert [i.env[env.GROUP_RANK] for i in plan.instances] == ["0", "0", "1", "1", "2", "2"]
    assert {i.env[env.GROUP_WORLD_SIZE] for i in plan.instances} == {"3"}


def test_a_job_wide_x_chooses_master_addr_and_port_as_torchruns_options_do() -> None:
    spec = build_spec({"offline_mode": "yes", "num_instances": 2, "num_replicas": 2,
                       "mpi_local_args": ["-x MASTER_PORT=29511 -x MASTER_ADDR"]}, ["p"])
    plan = make_plan(spec.placement, spec.instance, programs=Programs(("p",)), job_id="j",
                     allocation=offline_allocation(spec.placement, spec.vipu), master_port=1,
                     launcher_environ={"MASTER_ADDR": "node7"}, cwd="/")
    assert [(i.env[env.MASTER_ADDR], i.env[env.MASTER_PORT]) for i in plan.instances] == [("node7", "29511")] * 2


@pytest.mark.parametrize("options, error", [
    ({"mpi_local_args": ["-x MASTER_PORT=70000"]}, "-x MASTER_PORT='70000' is not a port: use a number from 1"),
    ({"mpi_local_args": ["-x MASTER_PORT=http"]}, "-x MASTER_PORT='http' is not a port"),
    ({"mpi_global_args": ["-x MASTER_PORT=0"]}, "-x MASTER_PORT='0' is not a port"),
    ({"mpi_local_args": ["-x MASTER_ADDR="]}, "-x MASTER_ADDR='' is not a host name or address"),
    ({"instance_mpi_local_args": ["1:-x MASTER_PORT=29511"]},
     "--instance-mpi-local-args=1: -x MASTER_PORT must be the same for every instance"),
])
def test_a_bad_or_per_instance_master_choice_is_a_usage_error(options: dict, error: str) -> None:
    with pytest.raises(UsageError) as caught:
        build_spec({"offline_mode": "yes", "num_instances": 2, "num_replicas": 2, **options}, ["p"])
    assert str(caught.value).startswith(error)


def test_instances_an_agent_starts_run_the_program_as_typed_and_get_no_local_descriptors() -> None:
    spec = build_spec({"offline_mode": "yes", "num_instances": 2, "num_replicas": 2, "host": ["a,b"]}, ["prog", "x"])
    plan = make_plan(spec.placement, spec.instance, job_id="j", master_port=1, launcher_environ={}, cwd="/",
                     programs=Programs(("/usr/bin/prog", "x"), spec.program, frozenset({"b"})),
                     allocation=offline_allocation(spec.placement, spec.vipu), device_fds={0: (7,)})
    here, there = plan.instances
    assert here.argv == ("/usr/bin/prog", "x") and here.pass_fds == (7,) and here.env[env.DEVICE_FDS] == "7"
    assert there.argv == ("prog", "x") and there.pass_fds == () and env.DEVICE_FDS not in there.env


def test_a_function_launch_builds_the_records_poprun_builds_from_its_options() -> None:
    """launch() no longer writes an mpirun-style line to parse back: its records must equal what that gave."""
    for launch in (FunctionLaunch(4, 8, 2), FunctionLaunch(1, offline=False), FunctionLaunch(2, timeout=3.0)):
        built = launch.spec("fn")
        parsed = build_spec({"num_instances": launch.num_instances, "num_replicas": launch.replicas,
                             "ipus_per_replica": launch.ipus_per_replica, "offline_mode": launch.offline,
                             "mpi_global_args": ["--tag-output"]}, ["fn"])
        assert built.supervision.timeout == launch.timeout
        assert dataclasses.replace(built, supervision=parsed.supervision) == parsed


def test_a_function_launch_meets_the_bounds_poprun_options_meet() -> None:
    """The same bound as poprun's, said in launch()'s own keywords, when the launch is made (before anything
    starts), not when its spec is built."""
    with pytest.raises(ValueError, match=r"num_replicas=1048576 x ipus_per_replica=2 is .* at most"):
        FunctionLaunch(1, 2**20, 2)


def test_the_slurm_hosts_replace_only_the_placements() -> None:
    from poprun_py.reach import with_allocation_hosts

    spec = build_spec({"num_instances": 2, "num_replicas": 2}, ["p"])
    placement, via_srun = with_allocation_hosts(spec.placement, {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]"})
    assert via_srun and [h.name for h in placement.hosts] == ["n1", "n2"]
    assert dataclasses.replace(placement, hosts=()) == spec.placement
    assert with_allocation_hosts(dataclasses.replace(spec.placement, hosts=(HostSpec("h"),)),
                                 {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1"})[1] is False
