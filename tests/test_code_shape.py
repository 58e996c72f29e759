"""The shape of the code, read from its syntax trees: no import circles in src/, so each module can be read
(and loaded) after the ones it needs; the three floors (``poprun_py`` on ``popdist`` on ``simipu``, the
import hook beside them) import only downwards; and no function longer than a screen, so each can be read at
once.

An import inside a function counts: it runs as surely as one at the top, only later, and a circle through it
still means neither module can be understood without the other. An import under ``if TYPE_CHECKING:`` does
not: it never runs, it only names a type.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
#: Lines a function may span, from its ``def`` to its last line: past this, split it where a step has a name.
MAX_FUNCTION_LINES = 60


def modules(root: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root`` by dotted name, with its file and whether it is a package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` that can run (anywhere, functions included), not TYPE_CHECKING's."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                pending.extend(child.orelse)
            else:
                pending.append(child)
    return found


def imported_modules(name: str, known: dict[str, tuple[Path, bool]]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports: ``from a import b`` is ``a.b`` when that is a
    module, else ``a`` (a package's ``__init__``); relative imports resolved against ``name``'s package."""
    path, package = known[name]
    here = name if package else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imported_modules(name, known) for name in known}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_src_has_no_import_circles() -> None:
    graph = import_graph()
    assert len(graph) > 100 and graph["popdist.core"], "the modules and their imports were read"
    found = circles(graph)
    assert not found, "import circles (each a set of modules that import one another): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_reader_finds_circles_through_functions_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: a circle closed by a function-level relative import is one; TYPE_CHECKING's is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    (package / "d.py").write_text("from .c import x\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.d"] == {"pkg.c"} and graph["pkg.c"] == set()
    assert circles(graph) == [["pkg.a", "pkg.b"]]


def long_functions(roots: tuple[Path, ...], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` for each function or method under ``roots`` longer than ``limit`` lines."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


#: Each floor with the floors it may import (ARCHITECTURE.md): the launcher, what programs import, the system.
FLOORS = {"poprun_py": {"poprun_py", "_poprun_py_hook", "popdist", "simipu"}, "popdist": {"popdist", "simipu"},
          "_poprun_py_hook": {"_poprun_py_hook", "popdist", "simipu"}, "simipu": {"simipu"}}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, targets in graph.items() for target in targets
                  if target.partition(".")[0] not in FLOORS[name.partition(".")[0]])


def test_the_floors_import_only_downwards() -> None:
    graph = import_graph()
    assert set(FLOORS) >= {name.partition(".")[0] for name in graph}, "a new top-level package needs its floor"
    assert upward_imports(graph) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    for package, body in (("simipu", "from popdist import core\n"), ("popdist", "")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(body)
    (tmp_path / "popdist" / "core.py").write_text("")
    assert upward_imports(import_graph(tmp_path)) == ["simipu imports popdist.core"]


def test_no_function_is_longer_than_a_screen() -> None:
    found = long_functions((SRC, ROOT / "benchmarks"))
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them where a step has a name): " + "; ".join(
        found)


def test_the_length_check_counts_from_def_to_the_last_line(tmp_path: Path) -> None:
    """The checker itself: 60 lines pass, 61 fail, methods included."""
    fits = "def fits():\n" + "".join(f"    x{i} = {i}\n" for i in range(59))
    over = "class C:\n    def over(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(60))
    (tmp_path / "m.py").write_text(fits + "\n\n" + over)
    assert [f.split(" ", 1)[1] for f in long_functions((tmp_path,))] == ["over (61 lines)"]
