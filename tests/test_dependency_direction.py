"""The dependency direction common <- dataprep <- {trainer, tools}; dataprep and tools without
torch."""

from __future__ import annotations

import ast
import subprocess
import sys
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
