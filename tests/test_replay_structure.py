"""The replay package's shape (issue 22, target 8): no module over 600 lines, and imports
between its modules run one way -- counting every import, also those under
``TYPE_CHECKING`` and inside functions (a cycle there is still a cycle for a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "kbtrace" / "replay"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path, names: set[str]) -> set[str]:
    """The replay modules ``mod`` imports (``from X import Y``: X.Y when that is a module)."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in names else base)
    # a package's submodules are imported with (after) it; an edge to an enclosing
    # package is Python's own, not a design dependency
    return {m for m in found if m in names and m != mod and not mod.startswith(m + ".")}


def test_no_replay_module_is_over_600_lines():
    long = {m: n for m, p in _modules().items()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_replay_imports_have_no_cycles():
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    assert "kbtrace.replay.engine" in graph["kbtrace.replay"]       # the walk sees imports
    assert "kbtrace.replay.fabric.booking" in graph["kbtrace.replay.fabric.fast"]
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []
