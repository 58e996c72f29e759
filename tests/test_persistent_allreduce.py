"""``popdist.collectives.allreduce_init`` (MPI 4's persistent allreduce): the plain call's bits, its checks,
its errors, on every path (the shared-memory board, shared memory, the sockets, one instance alone)."""

from __future__ import annotations

import json

import pytest

from support import python_program, run_poprun

OFFLINE = "--offline-mode=1"


def run(instances: int, mode: str, *extra: str):
    return run_poprun(OFFLINE, "--num-instances", str(instances), "--num-replicas", str(instances), *extra,
                      *python_program("persistent_allreduce.py", mode))


@pytest.mark.parametrize("instances,transport", [(1, "auto"), (2, "auto"), (3, "tcp"), (4, "auto")])
def test_a_persistent_allreduce_gives_the_plain_calls_bits(instances: int, transport: str) -> None:
    result = run(instances, "results", f"--fabric-transport={transport}")
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")]
    assert sorted(r["instance"] for r in records) == list(range(instances))
    assert all(r["digests"] == records[0]["digests"] for r in records)  # every instance, the same bits


def test_the_shared_memory_paths_give_the_sockets_bits() -> None:
    """Over TCP every allreduce takes the general socket algorithms; on one host the board and the shared
    arenas' plans (board.py, engine's ``_whole_on_board``) do: the same reduction order, so the same bits."""
    digests = {}
    for transport in ("auto", "tcp"):
        result = run(3, "results", f"--fabric-transport={transport}")
        assert result.returncode == 0, result.stderr.decode()[-3000:]
        records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith(b"{")]
        digests[transport] = {r["instance"]: r["digests"] for r in records}
    assert digests["auto"] == digests["tcp"]


def test_a_persistent_allreduce_of_mismatched_arrays_raises_on_every_side() -> None:
    result = run(3, "mismatch")
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("mismatch:")]
    assert len(lines) == 3, (lines, result.stderr.decode()[-2000:])
    assert all("float32[3]" in line and "float32[4]" in line for line in lines), lines
    assert result.returncode == 4


def test_an_array_that_cannot_be_bound_is_refused_with_the_fix() -> None:
    result = run(2, "misuse")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    lines = [line for line in result.stdout.decode().splitlines() if line.startswith("refused:")]
    assert len(lines) == 8, lines  # four arrays on each of two instances
    assert sum("np.ascontiguousarray" in line for line in lines) == 6
    assert sum("numeric arrays" in line for line in lines) == 2
