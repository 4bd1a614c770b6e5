"""src/npurt/_native.pyi against the built npurt._native: the same names, enum members, properties and
parameter names (pybind11 writes each function's signature in the first line of its docstring).

(mypy.stubtest also works on the module; it adds pybind11's metaclass and Buffer's placeholder __init__.)"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import npurt
from npurt import _native

STUB = ast.parse((Path(npurt.__file__).parent / "_native.pyi").read_text())


def _public(names: object) -> set[str]:
    return {n for n in names if not n.startswith("_")}  # type: ignore[attr-defined]


def _stub_top_level() -> dict[str, ast.stmt]:
    found: dict[str, ast.stmt] = {}
    for node in STUB.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def _stub_params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.kwonlyargs:
        names += ["*"] + [p.arg for p in a.kwonlyargs]
    return [n for n in names if n not in ("self", "cls")]


def _runtime_params(fn: object) -> list[str]:
    """Parameter names from a pybind11 docstring: 'name(a: T, b: U = x, *, c: V) -> R'."""
    line = inspect.getdoc(fn).splitlines()[0]  # type: ignore[union-attr]
    inner, depth, parts, part = line[line.index("(") + 1:line.rindex(") ->")], 0, [], ""
    for ch in inner:
        depth += ch in "([<{"
        depth -= ch in ")]>}"
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    names = [p.split(":")[0].split("=")[0].strip() for p in parts if p.strip()]
    return [n for n in names if n not in ("self", "/")]


def _class_members(cls: ast.ClassDef) -> tuple[dict[str, ast.FunctionDef], set[str], set[str]]:
    """(methods, properties, class attributes) written in a stub class."""
    methods: dict[str, ast.FunctionDef] = {}
    properties: set[str] = set()
    attributes: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                properties.add(node.name)
            else:
                methods[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            attributes.add(node.target.id)
    return methods, properties, attributes


def test_stub_names_are_the_module_names() -> None:
    assert set(_stub_top_level()) == _public(dir(_native))


@pytest.mark.parametrize("name", sorted(n for n, node in _stub_top_level().items() if isinstance(node, ast.ClassDef)))
def test_stub_class(name: str) -> None:
    node = _stub_top_level()[name]
    assert isinstance(node, ast.ClassDef)
    runtime = getattr(_native, name)
    methods, properties, attributes = _class_members(node)
    if hasattr(runtime, "__members__"):  # a pybind11 enum: its members are class attributes
        assert _public(attributes) == set(runtime.__members__)
    assert _public(methods) | properties | _public(attributes) == _public(dir(runtime))
    for prop in properties:
        assert isinstance(inspect.getattr_static(runtime, prop), property), prop
    for method_name, fn in methods.items():
        if method_name.startswith("__") and method_name not in ("__init__", "__len__", "__int__", "__index__"):
            continue  # (__eq__, __hash__: wrappers without a signature; __buffer__: a slot before Python 3.12)
        assert _stub_params(fn) == _runtime_params(getattr(runtime, method_name)), f"{name}.{method_name}"


@pytest.mark.parametrize("name", sorted(n for n, node in _stub_top_level().items()
                                        if isinstance(node, ast.FunctionDef)))
def test_stub_function_parameters(name: str) -> None:
    node = _stub_top_level()[name]
    assert isinstance(node, ast.FunctionDef)
    assert _stub_params(node) == _runtime_params(getattr(_native, name))


def test_stub_and_marker_ship_with_the_package() -> None:
    """(Meaningful for a non-editable install, as .ci/run makes: the files must be in the wheel.)"""
    package = Path(npurt.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_native.pyi").is_file()
