"""The import graph of src/speculative: no circle, and inference never imports training.

Every ``import`` and ``from ... import`` statement counts, at module level or inside a function
(a lazy import is still a dependency). Importing a module also runs its parent packages'
``__init__``; those implicit edges are not counted (every submodule would otherwise form a circle
with a package that re-exports it), but an explicit ``from ..pkg import name`` counts as an edge to
``pkg`` unless ``name`` is itself a submodule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


pytestmark = pytest.mark.quick

SRC = Path(__file__).resolve().parent.parent / "src" / "speculative"

#: modules allowed to import speculative.training: training itself and the command that runs it
TRAINING_FRONT_ENDS = ("speculative.training", "speculative.cli")


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    mods = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it imports (see the module docstring for what counts)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in mods]
                found = subs + ([source] if len(subs) < len(node.names) else [])
            else:
                continue
            graph[name].update(t for t in found if t in mods and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_inference_never_imports_training():
    graph = import_graph()
    bad = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                 if t.startswith("speculative.training") and not m.startswith(TRAINING_FRONT_ENDS))
    assert bad == []


@pytest.mark.parametrize("files, expect", [
    ({"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"}, [["speculative.a", "speculative.b"]]),
    ({"a.py": "from .b import y\n", "b.py": "import os\n"}, []),
    ({"p/__init__.py": "from .q import z\n", "p/q.py": "from . import r\n", "p/r.py": "from ..p import q\n"},
     [["speculative.p.q", "speculative.p.r"]]),
])
def test_the_check_sees_circles(tmp_path, files, expect):
    """The checker itself: a lazy import closes a circle, a one-way import does not."""
    root = tmp_path / "speculative"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert circles(import_graph(root)) == expect
