"""The fabric's layers, read from its syntax trees: which subpackage may import which, named phases rather
than bare numbers, one owner of a link's frame counters, one way to build a frame header.

The layers are the order things run in (see ``simipu/fabric/__init__.py``): ``join/`` sets the job up,
``frames/`` moves one phase's frames, ``algorithms/`` arrange phases into collectives, and ``engine`` and
``connect`` on top tie them together. A layer imports only those below it (and ``errors``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simipu.fabric.algorithms.phases import Phase
from simipu.fabric.frames.header import NBYTES, HeaderTemplate, encode_prefix, header_size
from test_code_shape import SRC, import_graph

FABRIC = SRC / "simipu" / "fabric"
#: What each layer may import of the fabric (besides itself and ``errors``); the top (engine, connect) anything.
MAY_IMPORT = {
    "join": set(),
    "frames": set(),
    "algorithms": {"frames", "join"},  # (join: the ``Membership`` record a group is made from)
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["simipu", "fabric"] else None


def test_each_layer_imports_only_the_layers_below_it() -> None:
    graph = import_graph()
    fabric = {name: targets for name, targets in graph.items() if name.startswith("simipu.fabric.")}
    assert {_layer(name) for name in fabric} >= set(MAY_IMPORT), "the three layers were found"
    wrong = []
    for name, targets in sorted(fabric.items()):
        layer = _layer(name)
        if layer is None:
            continue
        for target in sorted(targets):
            if not target.startswith("simipu.fabric.") or target == "simipu.fabric.errors":
                continue
            other = _layer(target)
            if other != layer and other not in MAY_IMPORT[layer]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "imports against the layers: " + "; ".join(wrong)


def _fabric_trees() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(FABRIC.rglob("*.py"))]


#: The calls that run one phase, and where their phase argument sits.
PHASE_ARGUMENT = {"run": 1, "run_all": 1, "receive_into_scratch": 1, "_exchange": 1, "signature": 0,
                  "prefix": 0}


def test_phases_are_named_not_bare_numbers() -> None:
    bare = []
    for path, tree in _fabric_trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in PHASE_ARGUMENT and len(node.args) > PHASE_ARGUMENT[name]:
                argument = node.args[PHASE_ARGUMENT[name]]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, int):
                    bare.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bare, "phase numbers written as bare literals (use algorithms.phases.Phase): " + ", ".join(bare)


def test_phase_numbers_are_distinct_and_stay_what_the_wire_carries() -> None:
    """Peers of one job run the same code, but the numbers are in every header: renumbering is a protocol
    change, and two names for one number would let two phases' frames pass each other's check."""
    assert {phase.name: int(phase) for phase in Phase} == {
        "FIRST": 1, "SECOND": 2, "SHARED_DRAIN": 10, "SHARED_READY": 11, "SHARED_REDUCED": 12,
        "SHARED_DONE": 13, "TO_LEADER": 21, "FROM_LEADER": 23,
        "CROSS_PROBE": 31, "CROSS_VERDICT": 32, "CROSS_READY": 33, "CROSS_DONE": 34}
    assert all(0 < phase < 256 for phase in Phase), "a phase is one byte of the header"


#: The inline copies of ``Link.claim`` and ``Link.took_published`` allowed outside frames/link.py (file,
#: function): the board's closures (``algorithms/board.py``, ``algorithms/board_copies.py``), where the method
#: calls were 5% of a 4 KiB call with one peer, and ``claim_each`` with ``took_published`` 11% of one with
#: three (callgrind's instruction counts); the board tests hold their frames in step with the general path's.
INLINE_COUNTERS = {("board.py", "one_peer_call"), ("board.py", "publisher"), ("board.py", "many_peers_call"),
                   ("board_copies.py", "many_peers_copy_call")}


def test_only_the_link_changes_its_frame_counters() -> None:
    """The frame-order invariant (each end numbers a link's frames; a receiver takes them in order whichever
    way each came) lives in ``frames/link.py`` alone: nothing else assigns a link's counters (nor, but the
    mailbox itself, the count of board publications taken), except ``INLINE_COUNTERS``."""
    changed = []
    for path, tree in _fabric_trees():
        if path == FABRIC / "frames" / "link.py":
            continue
        inline = {line for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and (path.name, f.name) in
                  INLINE_COUNTERS for line in range(f.lineno, (f.end_lineno or f.lineno) + 1)}
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in inline:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and (
                        target.attr.lstrip("_") in {"sent", "received"} and "link" in ast.unparse(target.value)
                        or target.attr == "board_taken" and path.name != "mailbox.py"):
                    changed.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not changed, "frame counters changed outside frames/link.py: " + "; ".join(changed)


@pytest.mark.parametrize("shape", [(), (3,), (2, 5, 7)])
def test_a_header_template_is_the_general_paths_header_with_each_calls_sequence_number(
        shape: tuple[int, ...]) -> None:
    """The board's allreduce builds its header once per signature; it must be byte for byte the header the
    general path (``Call.prefix`` and ``exchange``) writes and compares, or the two paths would not meet."""
    template = HeaderTemplate(1, 2, Phase.FIRST, "<f4", shape, -1, 0xFEED, 48)
    for seq in (1, 2, 255, 1 << 40):
        assert template.at(seq) == encode_prefix(1, 2, Phase.FIRST, "<f4", shape, -1, seq, 0xFEED) + NBYTES.pack(48)
    assert template.size == len(template.at(7)) == header_size(len(shape))
