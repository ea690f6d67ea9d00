"""The house's shape, checked from the code itself (every import, lazy ones included):
no import circle between files, no knot between packages, no source file over 400 lines
(reference/model.py aside), at most 15 entries at src/tformer's top level, each task kind named
in at most 4 source files, and errors that carry their field (never one formatted string)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "tformer"
LONG_ALLOWED = {"reference/model.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the tformer modules it imports, anywhere in it (a function's imports too)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                found = resolve(target) if target.startswith("tformer") else None
                if found and found != name:
                    edges[name].add(found)
                    break
    return edges


def _cycles(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_file_imports_itself_through_a_circle():
    modules = _modules()
    edges = _imports(modules)
    # A package's __init__ importing its own modules is not a circle of the code's layers.
    edges = {a: {b for b in bs if not (modules[a].name == "__init__.py" and b.startswith(a + "."))}
             for a, bs in edges.items()}
    assert _cycles(modules, edges) == []


def test_no_two_packages_import_each_other():
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in _imports(modules).items():
        for b in targets:
            pa, pb = _package(a), _package(b)
            if pa != pb and "tformer" not in (pa, pb):
                edges[pa].add(pb)
    knots = _cycles({_package(m) for m in modules}, edges)
    assert knots == [], "\n".join(
        f"{knot}: " + "; ".join(f"{a} -> {b}" for a in knot for b in sorted(edges[a] & set(knot)))
        for knot in knots)


def test_no_source_file_is_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert set(long) <= LONG_ALLOWED, long


def test_at_most_15_entries_at_the_top_level():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and
                     (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())))
    assert len(entries) <= 15, entries


def _string_constants(path: Path) -> set[str]:
    """The strings a module's code holds (its docstrings and comments aside, which may use a
    kind's name as an English word)."""
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_each_kind_is_named_in_at_most_4_source_files():
    """No switch on a kind's name outside its module: the name, as a string the code holds,
    is in at most 4 files (its module, the registry, and a few that must name it)."""
    from tformer.kinds import KINDS

    modules = _modules().values()
    for name in KINDS:
        files = [str(p.relative_to(PACKAGE)) for p in modules if name in _string_constants(p)]
        assert len(files) <= 4, (name, files)


@pytest.mark.parametrize("cls", ["FieldError", "BadType", "FieldNotFound", "FieldNotADirectory"])
def test_named_errors_carry_their_field(cls):
    """A named error is built from its field and its detail, never from one formatted string
    that a caller would have to parse to find the field."""
    pattern = re.compile(rf"\b{cls}\(f?[\"']")
    single = [f"{p.relative_to(PACKAGE)}:{i}" for p in _modules().values()
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if pattern.search(line) and not re.search(rf"\b{cls}\(f?[\"'][^\"']*[\"'],", line)]
    assert single == []
