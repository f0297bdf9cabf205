"""The dependency direction common <- dataprep <- {trainer, tools}; dataprep and tools without
torch; no import circles, between modules nor between a package's sub-packages."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "common": ("torch", "bloomline.dataprep", "bloomline.trainer"),
    "dataprep": ("torch", "bloomline.trainer"),
    "tools": ("torch", "bloomline.trainer"),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_no_import_against_the_direction(package):
    """Catches: common, dataprep or tools importing torch or the trainer, even lazily inside a
    function (data jobs and dataset inspection run on machines without torch)."""
    files = sorted((ROOT / "packages" / package / "src").rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            for bad in FORBIDDEN[package]:
                assert name != bad and not name.startswith(bad + "."), (
                    f"{path.relative_to(ROOT)} imports {name}")


@pytest.mark.slow
def test_importing_every_dataprep_module_loads_no_torch():
    """Catches: torch pulled in transitively (e.g. by a third-party import at module level)."""
    code = (
        "import pkgutil, importlib, sys, bloomline.dataprep as d\n"
        "for m in pkgutil.iter_modules(d.__path__):\n"
        "    importlib.import_module(d.__name__ + '.' + m.name)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- import circles ---------------------------------------------------------------------------
PACKAGES = ("common", "dataprep", "trainer", "tools")


def _modules(src: Path) -> dict[str, Path]:
    """The modules of the package in folder ``src`` by dotted name below it
    (``checkpoint.save``; a sub-package's ``__init__`` by the sub-package's name, the
    package's own as ``__init__``)."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _module_imports(package: str, root: Path = ROOT / "packages") -> dict[str, dict[str, int]]:
    """Module of bloomline.PACKAGE -> {module of the same package it imports: the line},
    counting imports at module level and inside functions alike (a circle through a lazy
    import is a circle)."""
    modules = _modules(root / package / "src" / "bloomline" / package)
    prefix = f"bloomline.{package}"

    def resolve(dotted: str) -> str | None:  # the longest module that ``dotted`` names
        if dotted == prefix:
            return "__init__"
        if not dotted.startswith(prefix + "."):
            return None
        parts = dotted[len(prefix) + 1:].split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, path, prefix)
                # ``from PKG import sub`` imports the module PKG.sub; ``from M import f``, M
                targets = [resolve(f"{base}.{alias.name}") or resolve(base)
                           for alias in node.names]
            for target in targets:
                if target is not None and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def _absolute(node: ast.ImportFrom, name: str, path: Path, prefix: str) -> str:
    """The absolute module an ``ImportFrom`` names (``from .x import y`` in PKG.a: PKG.x)."""
    if not node.level:
        return node.module or ""
    parts = [] if name == "__init__" else name.split(".")
    package = [*prefix.split("."), *(parts if path.name == "__init__.py" else parts[:-1])]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _circles(graph: dict[str, set[str] | dict]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _describe(circle: list[str], edges: dict[str, dict[str, list[str]]]) -> str:
    """Each edge inside a circle with the imports that make it."""
    lines = [" <-> ".join(circle)]
    for source in circle:
        for target in circle:
            if target in edges.get(source, {}):
                lines.append(f"  {source} -> {target}: {', '.join(edges[source][target])}")
    return "\n".join(lines)


def _unit_edges(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, list[str]]]:
    """The module graph folded onto sub-packages (a top-level module is its own unit), each
    edge with the imports that make it."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for source, targets in graph.items():
        for target, line in targets.items():
            if _unit(source) != _unit(target):
                edges[_unit(source)].setdefault(_unit(target), []).append(
                    f"{source.replace('.', '/')}.py:{line} imports {target}")
    return edges


def _unit(module: str) -> str:
    """The sub-package a module belongs to, or the top-level module itself."""
    return module.split(".")[0]


def test_the_circle_checks_see_circles_through_any_import_form(tmp_path):
    """Catches: a checker that passes because it resolves no import (relative imports, a
    sub-package's ``__init__``, ``from PKG import module``, a function-level import)."""
    src = tmp_path / "fake" / "src" / "bloomline" / "fake"
    (src / "sub").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "sub" / "__init__.py").write_text("from .b import B\n")
    (src / "sub" / "b.py").write_text("def f():\n    from bloomline.fake import top\nB = 1\n")
    (src / "top.py").write_text("from bloomline.fake import sub\n")
    (src / "other.py").write_text("from ..fake.top import x\n")
    graph = _module_imports("fake", tmp_path)
    assert graph == {"__init__": {}, "other": {"top": 1}, "sub": {"sub.b": 1},
                     "sub.b": {"top": 2}, "top": {"sub": 1}}
    assert _circles(graph) == [["sub", "sub.b", "top"]]
    assert _circles(_unit_edges(graph)) == [["sub", "top"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_between_modules(package):
    """Catches: two modules that import each other, directly or through others (one of them
    sees the other half-initialised, depending on which is imported first)."""
    graph = _module_imports(package)
    edges = {source: {target: [f"{source} line {line}"] for target, line in targets.items()}
             for source, targets in graph.items()}
    circles = _circles(graph)
    assert not circles, "\n".join(_describe(circle, edges) for circle in circles)


@pytest.mark.parametrize("package", ["trainer", "dataprep"])
def test_no_import_circle_between_sub_packages(package):
    """Catches: sub-packages that depend on each other (checkpoint/ importing survival/ while
    survival/ imports checkpoint/), each a sub-package (checkpoint/, survival/, parallel/,
    reporting/, ...) or a top-level module (config.py, loop.py, ...): such a pair can be
    neither understood, tested nor moved alone, even when no two modules form a circle."""
    edges = _unit_edges(_module_imports(package))
    circles = _circles(edges)
    assert not circles, "\n".join(_describe(circle, edges) for circle in circles)
