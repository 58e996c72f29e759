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


def keeps_its_group() -> dict:
    import numpy as np

    import popdist.collectives as C

    me = C.rank()
    x = np.full(3, me + 1.0)
    whole, out = C.allreduce_init(x), {}
    try:  # instances 0 and 1 only: instance 2 is not calling it, so it must not wait for it
        out["whole_in_pair"] = C.execute_on_instances({0, 1}, lambda: whole().tolist())
    except ValueError as error:
        out["whole_in_pair"] = str(error)
    out["whole_in_everyone"] = C.execute_on_instances({0, 1, 2}, lambda: whole().tolist())
    pair = C.execute_on_instances({0, 1}, lambda: C.allreduce_init(x))
    if pair is not None:  # bound across the pair: inside it, and outside any group, it spans the pair
        out["pair"] = [C.execute_on_instances({0, 1}, lambda: pair().tolist()), pair().tolist()]
    for name, call in (("root", lambda: C.broadcast(x, root=1.5)),
                       ("instances", lambda: C.execute_on_instances({0.7}, lambda: "ran"))):
        try:
            out[name] = call()
        except TypeError as error:
            out[name] = str(error)
    try:  # nested: instance 2 is outside the enclosing pair, so it never runs the inner call
        out["nested"] = C.execute_on_instances({0, 1}, C.execute_on_instances, {1, 2}, C.allreduce, x)
    except ValueError as error:
        out["nested"] = str(error)
    C.barrier()
    return out


def test_a_persistent_allreduce_keeps_the_group_it_was_bound_across_and_roots_are_integers() -> None:
    """Called inside execute_on_instances of other instances it refuses at once; before, instances 0 and 1
    waited for instance 2 until its next collective, then all three raised CollectiveMismatchError. A root of
    1.5 and an instance 0.7 were truncated by int() into instances 1 and 0. execute_on_instances nested in
    another and naming an instance outside it refuses at once on every member of the enclosing group; before,
    instance 1 waited for instance 2, which never ran it, and failed late with another call's error."""
    import poprun_py

    results = poprun_py.launch(keeps_its_group, num_instances=3, timeout=60)
    refused = ("this persistent allreduce was bound across every instance and is called inside "
               "execute_on_instances of instances [0, 1]")
    for me, out in enumerate(results):
        if me < 2:
            assert out["whole_in_pair"].startswith(refused), out
            assert out["pair"] == [[3.0] * 3, [3.0] * 3]
        assert out["whole_in_everyone"] == [6.0] * 3
        assert out["root"] == "broadcast's root must be an instance index (an integer), got 1.5"
        assert out["instances"] == "execute_on_instances: each instance must be an instance index (an integer), got 0.7"
        assert out["nested"] == (None if me == 2 else "execute_on_instances([1, 2]) inside execute_on_instances([0, 1])"
                                 ": instances [2] are outside the enclosing group, so they never run it; name only "
                                 "instances of the enclosing group, or call it outside that group"), out
