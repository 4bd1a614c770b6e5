"""The package's structure: imports point downward only (no cycles, type-only imports included), and no module
reaches into another module's private names. Read from the source with ast; nothing is imported (but by the last
test, which imports the package in a child process to see what it pulls in)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "npurt"

# Private names of the engines (ONNX Runtime's C++ session and binding objects) used for speed on the run path;
# tests/test_engine_privates.py fails, naming the engine's version, where one no longer holds.
ENGINE_PRIVATES = {"_sess", "_iobinding", "_get_c_device", "_pyopenvino"}
# Python's own, documented for specialized uses: the threads' frames (shutdown.py looks for runs inside engines)
PYTHON_PRIVATES = {"_current_frames"}


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
    return defined_privates_of(ast.parse(path.read_text(encoding="utf-8")))


def defined_privates_of(tree: ast.AST) -> set[str]:
    """The private names defined in a module's or a class's tree (methods, ``self._x = ...``, class-level names,
    ``__slots__``)."""
    names = set()
    for node in ast.walk(tree):
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


def annotation_class(node: ast.expr | None) -> str | None:
    """The class an annotation names: ``C``, ``"C"``, ``C | None``, ``Optional[C]`` (None for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [annotation_class(node.left), annotation_class(node.right)]
        named = [s for s in sides if s not in (None, "None")]
        return named[0] if len(named) == 1 else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return annotation_class(node.slice)
    return None


class ModuleTypes:
    """What a module's own code says about the classes of its local names, enough to tell ``state._lock`` on an
    object of this module's class from the same name on another module's object: a parameter's annotation,
    ``x = C(...)``, ``x = C.__new__(C)``, ``x: C = ...``, and ``x = self.attr`` where the class assigns ``self.attr``
    from an annotated parameter or annotates it."""

    def __init__(self, tree: ast.Module) -> None:
        self.classes: dict[str, set[str]] = {}  # this module's classes -> the private names each defines
        self.attr_types: dict[str, dict[str, str]] = {}  # class -> self.attr -> class
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = defined_privates_of(node)
                self.attr_types[node.name] = self.self_attr_types(node)

    @staticmethod
    def self_attr_types(cls: ast.ClassDef) -> dict[str, str]:
        found: dict[str, str] = {}
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                named = annotation_class(item.annotation)
                if named:
                    found[item.target.id] = named
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = {a.arg: annotation_class(a.annotation) for a in all_args(item)}
            for node in ast.walk(item):
                target, value, named = None, None, None
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign):
                    target, value, named = node.target, node.value, annotation_class(node.annotation)
                if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self"):
                    continue
                if named is None and isinstance(value, ast.Name):
                    named = params.get(value.id)
                if named:
                    found[target.attr] = named
        return found

    def local_types(self, function: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> dict[str, str]:
        """Local name -> class in ``function`` (and the functions inside it); ``owner``: the class it belongs to."""
        types: dict[str, str] = {}
        for node in ast.walk(function):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for a in all_args(node):
                    named = annotation_class(a.annotation)
                    if named:
                        types[a.arg] = named
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                named = annotation_class(node.annotation)
                if named:
                    types[node.target.id] = named
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                named = self.value_class(node.value, owner)
                if named:
                    types[node.targets[0].id] = named
        return types

    def value_class(self, value: ast.expr, owner: str | None) -> str | None:
        if isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Name):
                return func.id
            if isinstance(func, ast.Attribute) and func.attr == "__new__" and isinstance(func.value, ast.Name):
                return func.value.id
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self" \
                and owner is not None:
            return self.attr_types.get(owner, {}).get(value.attr)
        return None


def all_args(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = node.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
            *([a.kwarg] if a.kwarg else [])]


def functions_with_owner(tree: ast.Module) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str | None]]:
    """The module's outermost functions, each with the class it is a method of (None for a module function)."""
    out: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str | None]] = []

    def visit(node: ast.AST, owner: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child, owner))
            else:
                visit(child, owner)

    visit(tree, None)
    return out


def private_uses(path: Path, owners: dict[str, set[Path]], root: Path = SRC) -> list[str]:
    """``x._name`` where x is not self / cls / super(), unless no other module defines ``_name``, or x is a local
    name whose class (ModuleTypes) is one of this module's classes and defines ``_name`` itself. A private that
    another module defines too, on an object whose class this module does not show to be its own, is a reach across
    a module's boundary."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    types = ModuleTypes(tree)
    for function, owner in [*functions_with_owner(tree), (tree, None)]:
        local = types.local_types(function, owner) if not isinstance(function, ast.Module) else {}
        nodes = ast.walk(function) if not isinstance(function, ast.Module) else module_level_nodes(tree)
        for node in nodes:
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in ENGINE_PRIVATES | PYTHON_PRIVATES:
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            if owners.get(attr) == {path}:  # this module alone defines it
                continue
            # a local of one of this module's classes that defines it (``state._lock`` in StreamState's module)
            named = local.get(value.id) if isinstance(value, ast.Name) else None
            if named is not None and attr in types.classes.get(named, ()):
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno}: .{attr}")
    return found


def module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """The module's nodes outside any function (class bodies' statements included)."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(child)
                stack.append(child)
    return out


def private_imports(name: str, path: Path, known: dict[str, Path], root: Path = SRC) -> list[str]:
    """``from .module import _private`` (or ``from npurt.module import _private``): a module's private name taken
    by another module. A private module of the package (``from . import _native``) is a module, not a name."""
    found = []
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    compiled = {p.name.split(".")[0] for p in (SRC / PACKAGE).glob("_*.pyi")}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            base = ".".join(package[: len(package) - (node.level - 1)] + ([base] if base else []))
        if base != PACKAGE and not base.startswith(PACKAGE + "."):
            continue
        for alias in node.names:
            if not alias.name.startswith("_") or alias.name.startswith("__"):
                continue
            if f"{base}.{alias.name}" in known or (base == PACKAGE and alias.name in compiled):
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno}: from {base} import {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    known = modules()
    found = [use for name, path in sorted(known.items()) for use in private_imports(name, path, known)]
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_the_privacy_checks_catch_what_they_are_for(tmp_path):
    """The two checks fail where they should: a private name imported, and ``x._lock`` on an object whose class
    this module does not show to be its own while another module defines ``_lock`` too."""
    module = tmp_path / "user.py"
    module.write_text("from .types import _hidden\nfrom . import _native\n")
    known = {"npurt.types": SRC / PACKAGE / "types.py", "npurt.user": module}
    assert [u.split(": ", 1)[1] for u in private_imports("npurt.user", module, known, tmp_path)] == \
        ["from npurt.types import _hidden"]
    own = tmp_path / "own.py"
    own.write_text("class State:\n    def __init__(self):\n        self._lock = 1\n\n"
                   "class Turn:\n    def __init__(self, state: State, other):\n        self.state = state\n"
                   "        self.other = other\n\n    def go(self):\n        state = self.state\n"
                   "        other = self.other\n        return state._lock, other._lock\n")
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("class Other:\n    def __init__(self):\n        self._lock = 2\n")
    owners = {"_lock": {own, elsewhere}}
    uses = [u.rsplit(":", 2)[1:] for u in private_uses(own, owners, tmp_path)]
    assert uses == [["13", " ._lock"]], uses


def test_no_module_reaches_into_another_objects_privates():
    paths = sorted(modules().values())
    owners: dict[str, set[Path]] = {}
    for path in paths:
        for name in defined_privates(path):
            owners.setdefault(name, set()).add(path)
    found = [use for path in paths for use in private_uses(path, owners)]
    assert not found, "private names used across objects or modules:\n" + "\n".join(found)


def test_importing_npurt_leaves_onnx_and_the_engines_unimported():
    """``import npurt`` is what every app pays: the onnx package (~30 ms and its protobuf classes) is imported only
    where a graph is edited, no engine before a backend is asked for, and npurt.huge_pages (~1 ms) only where a
    runner may ask for huge pages."""
    code = ("import sys, npurt; print(sorted(m for m in ('onnx', 'openvino', 'onnxruntime', 'npurt.huge_pages') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
