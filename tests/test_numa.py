"""NUMA placement: sysfs parsing, cpuset honouring, round-robin binding of real instances."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun_py.numa import NumaNode, parse_cpulist, place, read_numa_nodes
from poprun_py.ranges import format_cpus
from support import run_poprun

ALLOWED = sorted(os.sched_getaffinity(0))


def fake_sysfs(root: Path, cpulists: list[str]) -> Path:
    for index, cpulist in enumerate(cpulists):
        node = root / "devices" / "system" / "node" / f"node{index}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpulist + "\n")
    (root / "devices" / "system" / "node" / "online").write_text(f"0-{len(cpulists) - 1}\n")
    return root


@pytest.mark.parametrize("text,cpus", [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", ())])
def test_cpulist_format(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(format_cpus(cpus)) == cpus


def test_nodes_are_read_from_an_injected_sysfs(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, ["0-1", "2-3", "4-5", "6-7"])
    assert read_numa_nodes(root) == tuple(NumaNode(i, (2 * i, 2 * i + 1)) for i in range(4))
    assert len(read_numa_nodes(tmp_path / "missing")) == 1  # no sysfs: one node with every CPU


def test_round_robin_over_the_nodes_the_cpuset_allows() -> None:
    nodes = (NumaNode(0, (0, 1)), NumaNode(1, (2, 3)), NumaNode(2, (4, 5)), NumaNode(3, (6, 7)))
    placement = place(4, nodes, allowed={0, 1, 2, 5, 6, 7})
    assert [(node.index, cpus) for node, cpus in placement] == [(0, (0, 1)), (1, (2,)), (2, (5,)), (3, (6, 7))]
    placement = place(3, nodes, allowed={2, 3})  # a cpuset inside one node: everyone there
    assert [node.index for node, _ in placement] == [1, 1, 1]
    with pytest.raises(ValueError, match="no NUMA node"):
        place(1, nodes, allowed={99})


def test_bind_to_hwthread_gives_each_instance_one_cpu_spread_over_the_nodes() -> None:
    nodes = (NumaNode(0, (0, 1)), NumaNode(1, (2, 3)))
    placed = place(5, nodes, allowed={0, 1, 2, 3}, unit="hwthread")
    assert [(node.index, cpus) for node, cpus in placed] == [(0, (0,)), (1, (2,)), (0, (1,)), (1, (3,)), (0, (0,))]
    placed = place(3, nodes, allowed={1, 3}, unit="hwthread")  # the cpuset's CPUs only, round-robin once all are used
    assert [cpus for _, cpus in placed] == [(1,), (3,), (1,)]


def test_bind_to_core_gives_each_instance_a_whole_core() -> None:
    """Two hardware threads per core (CPUs 0 and 4 share one, as Linux numbers them): ``core`` binds an instance
    to both, ``hwthread`` to one; a sibling outside the cpuset is left out."""
    nodes = (NumaNode(0, tuple(range(8))),)
    siblings = {cpu: (cpu % 4, cpu % 4 + 4) for cpu in range(8)}
    placed = place(3, nodes, allowed=range(8), unit="core", siblings=siblings)
    assert [cpus for _, cpus in placed] == [(0, 4), (1, 5), (2, 6)]
    placed = place(2, nodes, allowed={0, 1, 4}, unit="core", siblings=siblings)
    assert [cpus for _, cpus in placed] == [(0, 4), (1,)]
    assert [cpus for _, cpus in place(2, nodes, allowed=range(8), unit="hwthread")] == [(0,), (1,)]


def test_a_placement_holds_one_round_of_its_nodes_and_units_however_many_instances() -> None:
    """A dry run may place 2**20 instances on a host: the placement repeats once every node and unit has had
    its turn (nodes of 1, 2 and 3 hardware threads here: 3 * lcm(1, 2, 3) = 18), so one round is kept."""
    nodes = (NumaNode(0, (0,)), NumaNode(1, (1, 2)), NumaNode(2, (3, 4, 5)))
    placed = place(2**20, nodes, allowed=range(6), unit="hwthread")
    assert len(placed) == 2**20 and len(placed.round) == 18
    expected = [(k % 3, nodes[k % 3].cpus[(k // 3) % len(nodes[k % 3].cpus)]) for k in range(40)]
    assert [(node.index, cpus[0]) for node, cpus in placed[:40]] == expected
    last = 2**20 - 1
    assert placed[last] == placed[-1] == placed[last % 18]
    with pytest.raises(IndexError):
        placed[2**20]
    assert len(place(2**20, nodes, allowed=range(6)).round) == 3


def fake_threads(root: Path, siblings: dict[int, str]) -> None:
    """sysfs's ``cpuN/topology/thread_siblings_list`` for each CPU given."""
    for cpu, cpulist in siblings.items():
        topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(cpulist + "\n")


def affinities(*args: str, sysfs: Path, instances: int = 2) -> dict[int, list[int]]:
    n = str(instances)
    result = run_poprun(
        "--offline-mode=1", "--num-instances", n, "--num-replicas", n, *args,
        "sh", "-c", 'echo "$OMPI_COMM_WORLD_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"',
        env={**os.environ, "POPRUN_SYSFS_ROOT": str(sysfs)})
    assert result.returncode == 0, result.stderr
    pairs = (line.split() for line in result.stdout.decode().splitlines())
    return {int(rank): list(parse_cpulist(cpus)) for rank, cpus in pairs}


needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="binding two nodes apart needs two CPUs in poprun's cpuset")


@needs_two_cpus
def test_several_instances_per_host_are_bound_automatically(tmp_path: Path) -> None:
    # a 4-node machine whose last two nodes lie outside the cpuset: they are skipped
    sysfs = fake_sysfs(tmp_path, [str(ALLOWED[0]), str(ALLOWED[1]), "1000-1001", "1002-1003"])
    assert affinities(sysfs=sysfs, instances=3) == {0: [ALLOWED[0]], 1: [ALLOWED[1]], 2: [ALLOWED[0]]}


@needs_two_cpus
def test_placement_disabled_and_single_instances_stay_unbound(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, [str(ALLOWED[0]), str(ALLOWED[1])])
    assert affinities("--process-placement=disabled", "--numa-aware=yes", sysfs=sysfs) == {0: ALLOWED, 1: ALLOWED}
    assert affinities(sysfs=sysfs, instances=1) == {0: ALLOWED}
    assert affinities("--numa-aware=yes", sysfs=sysfs, instances=1) == {0: [ALLOWED[0]]}
    assert affinities("--numa-aware=no", sysfs=sysfs) == {0: ALLOWED, 1: ALLOWED}


@needs_two_cpus
def test_print_topology_shows_the_cpus(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, [str(ALLOWED[0]), str(ALLOWED[1])])
    result = run_poprun("--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "--print-topology=yes", "true",
                        env={**os.environ, "POPRUN_SYSFS_ROOT": str(sysfs)})
    assert f"instance 1 on localhost: CPUs {ALLOWED[1]}".encode() in result.stderr


@needs_two_cpus
@pytest.mark.parametrize("nodes", [1, 2])
def test_mpirun_bind_to_core_binds_each_instance_to_its_own_cpu(tmp_path: Path, nodes: int) -> None:
    """``--mpi-local-args='--bind-to core'`` as mpirun takes it: a core each (here one CPU: sysfs describes no
    hardware threads), over every node's CPUs, whether the host has one NUMA node or two (and whatever
    --numa-aware says)."""
    cpulists = [f"{ALLOWED[0]},{ALLOWED[1]}"] if nodes == 1 else [str(ALLOWED[0]), str(ALLOWED[1])]
    sysfs = fake_sysfs(tmp_path, cpulists)
    assert affinities("--mpi-local-args=--bind-to core", sysfs=sysfs) == {0: [ALLOWED[0]], 1: [ALLOWED[1]]}
    assert affinities("--mpi-global-args=--bind-to hwthread", "--numa-aware=no", sysfs=sysfs) == \
        {0: [ALLOWED[0]], 1: [ALLOWED[1]]}


@needs_two_cpus
def test_mpirun_bind_to_core_binds_to_a_whole_core_of_two_hardware_threads(tmp_path: Path) -> None:
    """poprun's two CPUs described as two hardware threads of one core: ``core`` gives each instance that core,
    and says it is shared; ``hwthread`` gives each a thread."""
    sysfs = fake_sysfs(tmp_path, [f"{ALLOWED[0]},{ALLOWED[1]}"])
    pair = f"{ALLOWED[0]},{ALLOWED[1]}"
    fake_threads(sysfs, {ALLOWED[0]: pair, ALLOWED[1]: pair})
    pinned = [ALLOWED[0], ALLOWED[1]]
    assert affinities("--mpi-local-args=--bind-to core:overload-allowed", sysfs=sysfs) == {0: pinned, 1: pinned}
    assert affinities("--mpi-local-args=--bind-to hwthread", sysfs=sysfs) == {0: [ALLOWED[0]], 1: [ALLOWED[1]]}


@needs_two_cpus
def test_mpirun_bind_to_numa_and_none(tmp_path: Path) -> None:
    """``--bind-to none`` leaves instances unbound (mpirun's meaning), unless --numa-aware=yes says otherwise;
    ``--bind-to numa`` binds a single instance to its node as --numa-aware=yes does."""
    sysfs = fake_sysfs(tmp_path, [str(ALLOWED[0]), str(ALLOWED[1])])
    assert affinities("--mpi-local-args=--bind-to none", sysfs=sysfs) == {0: ALLOWED, 1: ALLOWED}
    assert affinities("--mpi-local-args=--bind-to none", "--numa-aware=yes", sysfs=sysfs) == \
        {0: [ALLOWED[0]], 1: [ALLOWED[1]]}
    assert affinities("--mpi-local-args=--bind-to numa", sysfs=sysfs, instances=1) == {0: [ALLOWED[0]]}


def test_bind_to_core_with_more_instances_than_cpus_says_so_unless_overload_is_allowed(tmp_path: Path) -> None:
    """Open MPI refuses to put two processes on a core without ``overload-allowed``; poprun-py binds them
    round-robin and warns once, naming the qualifier (with it: no warning)."""
    sysfs = fake_sysfs(tmp_path, [str(ALLOWED[0])])  # one CPU for three instances
    env = {**os.environ, "POPRUN_SYSFS_ROOT": str(sysfs)}
    common = ["--offline-mode=1", "--num-instances", "3", "--num-replicas", "3"]
    shared = run_poprun(*common, "--mpi-local-args=--bind-to core", "true", env=env)
    assert shared.returncode == 0, shared.stderr
    warnings = [line for line in shared.stderr.decode().splitlines() if " POPRUN [W] " in line]
    assert len(warnings) == 1 and "3 instances on 1 core here" in warnings[0] and "overload-allowed" in warnings[0], warnings
    quiet = run_poprun(*common, "--mpi-local-args=--bind-to core:overload-allowed", "true", env=env)
    assert quiet.returncode == 0 and b" POPRUN [W] " not in quiet.stderr, quiet.stderr
