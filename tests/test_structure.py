"""The package's structure: imports point downward only (no cycles, type-only imports included), and no module
reaches into another module's private names. Read from the source with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "npurt"

# Private names of the engines (ONNX Runtime's C++ session and binding objects) used for speed on the run path;
# tests/test_engine_privates.py fails, naming the engine's version, where one no longer holds.
ENGINE_PRIVATES = {"_sess", "_iobinding", "_get_c_device", "_pyopenvino"}


def modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of the package that ``name`` imports, at any scope (under TYPE_CHECKING too)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - (node.level - 1)] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # a package's own __init__ is not a cycle, nor is a package re-exporting its children
            if target and target != name and not name.startswith(target + ".") and not target.startswith(name + "."):
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
                        result.append(sorted(component))
    return result


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def defined_privates(path: Path) -> set[str]:
    """The private attribute names a module defines: ``self._x = ...``, ``def _x``, class-level ``_x = ...``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] \
                    if isinstance(item, ast.AnnAssign) else []
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Tuple) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
                    names |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(path: Path, owners: dict[str, set[Path]]) -> list[str]:
    """``x._name`` where x is not self / cls / super(), unless the module defines ``_name`` itself and x is a local
    name (a class using a private of another object of its own module's classes), or no other module defines it. A
    private that only another module defines is a reach across a module's boundary."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in ENGINE_PRIVATES:
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            continue
        defined_here = path in owners.get(attr, ())
        # this module alone defines it, or a local of one of this module's classes (``state._lock`` in the class's
        # own module); a chain such as ``self.runner._submit`` must be this module's alone
        if owners.get(attr) == {path} or defined_here and isinstance(value, ast.Name):
            continue
        found.append(f"{path.relative_to(SRC)}:{node.lineno}: .{attr}")
    return found


def test_no_module_reaches_into_another_objects_privates():
    paths = sorted(modules().values())
    owners: dict[str, set[Path]] = {}
    for path in paths:
        for name in defined_privates(path):
            owners.setdefault(name, set()).add(path)
    found = [use for path in paths for use in private_uses(path, owners)]
    assert not found, "private names used across objects or modules:\n" + "\n".join(found)
