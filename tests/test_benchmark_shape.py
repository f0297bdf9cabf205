"""The shape of ``benchmarks/``: a package of small modules run as ``python -m benchmarks.<name>``,
each benchmark split into ``measure`` and ``report``, importing only the product and
``benchmarks.harness`` (never test code, never through ``sys.path`` edits)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
FILES = sorted(BENCHMARKS.rglob("*.py"))
# helper modules of the test folders, imported by bare name where a test folder is on sys.path
TEST_MODULES = {"conftest", "distributed", "equivalence", "trainer_fixtures"}
# the modules `make bench-*` runs: each has its measure/report split (a helper module inside a
# subpackage, as `make wheelhouse` runs benchmarks.gpu_checks.wheelhouse, is no benchmark)
MAKEFILE_MODULES = sorted(set(re.findall(r"-m benchmarks\.(\w+)(?![\w.])",
                                         (ROOT / "Makefile").read_text(encoding="utf-8"))))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_there_are_benchmarks_to_check():
    """Catches: the checks below passing vacuously after the folder moves or is renamed."""
    assert len(FILES) > 10 and len(MAKEFILE_MODULES) >= 9


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_file_is_small(path):
    """Catches: a benchmark file growing past 500 lines again (the 1,000-line scripts, whose
    one function measured, printed and wrote the result file at once)."""
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_FILE_LINES, f"{_name(path)}: {lines} lines (at most {MAX_FILE_LINES})"


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_functions_are_small(path):
    """Catches: a function over 80 lines (a 432-line ``main`` that set up, measured and
    reported in one body)."""
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(_tree(path))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{_name(path)}: " + "; ".join(long)


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_no_sys_path_edits_or_test_imports(path):
    """Catches: a benchmark importing another script through ``sys.path.insert`` (the
    ``# noqa: E402`` imports of one script by another) or importing test code (a benchmark
    that put ``packages/trainer/tests`` on the path for its multi-process harness)."""
    source = path.read_text(encoding="utf-8")
    assert not re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=", source), (
        f"{_name(path)} edits sys.path: import from benchmarks.harness or the product")
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            assert "tests" not in parts and parts[0] not in TEST_MODULES \
                and not parts[0].startswith("test_"), f"{_name(path)} imports test code: {name}"


@pytest.mark.parametrize("module", MAKEFILE_MODULES)
def test_make_target_module_splits_measure_and_report(module):
    """Catches: a ``make bench-*`` target naming a module that does not exist, or a benchmark
    whose module lacks the ``measure(args) -> dict`` / ``report(dict)`` split (so its
    measurement cannot be called alone, at a tiny size, from a smoke check)."""
    path = BENCHMARKS / f"{module}.py"
    assert path.exists(), f"the Makefile runs benchmarks.{module}, which does not exist"
    tree = _tree(path)
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    imported = {alias.asname or alias.name for node in tree.body
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    for name in ("measure", "report", "main"):
        assert name in defined | imported, f"benchmarks.{module} has no {name}()"
