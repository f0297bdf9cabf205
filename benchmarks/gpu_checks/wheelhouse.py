"""The wheelhouse: what a GPU machine without network needs to run ``python3 -m
benchmarks.gpu_check``, prepared by ``make wheelhouse`` on a machine with network.

A GPU image has its own Python with a CUDA torch and most scientific packages. What it lacks is
bloomline itself and a few of its dependencies (zstandard and datasets on a typical image).
``make wheelhouse`` puts into ``wheelhouse/``:

- the wheels of the four bloomline distributions, built from this checkout (no dependencies);
- the third-party runtime dependencies those distributions declare (torch excepted: the
  machine's own CUDA build is the point), at the versions ``requirements-dev.txt`` pins, the
  ones ``make test`` tests, downloaded as binary wheels for the GPU machine's Python and
  platform (``WHEEL_PYTHON``, ``WHEEL_PLATFORM``), with their own dependencies;
- ``SOURCE.json``: the digest of the bloomline sources the wheels were built from, so that the
  GPU machine can tell a wheelhouse that no longer matches its checkout.

The GPU machine installs only what it lacks from it (``environment.py``), with ``--no-index``.

Contract: :func:`runtime_requirements` lists the pins to download; :func:`source_digest` is the
one digest of a tree of bloomline sources (the checkout's or an installed copy's);
:func:`build_wheels` builds the four wheels from clean build folders; :func:`record` writes
``SOURCE.json``. Standard library only (``tomllib`` inside the
functions that need it): ``environment.py`` imports this module before it knows whether the
Python running it is recent enough.

``python -m benchmarks.gpu_checks.wheelhouse requirements`` prints the pins (one per line);
``... wheels DIR`` builds the bloomline wheels into DIR; ``... record DIR`` writes
``DIR/SOURCE.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["DISTRIBUTIONS", "REPO", "SOURCE_FILE", "build_wheels", "checkout_digest", "record",
           "runtime_requirements", "source_digest"]

REPO = Path(__file__).resolve().parents[2]
# folder under packages/ -> the distribution built from it
DISTRIBUTIONS = {"common": "bloomline-common", "dataprep": "bloomline-dataprep",
                 "trainer": "bloomline-trainer", "tools": "bloomline-tools"}
SOURCE_FILE = "SOURCE.json"
# the machine's own build is what the GPU check is about; never replaced from a wheelhouse
NOT_DOWNLOADED = {"torch"}


def _name(requirement: str) -> str:
    """The normalized project name at the start of a requirement string (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _pins(path: Path) -> dict[str, str]:
    """``name -> "name==version"`` for every ``==`` line of a requirements file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            pins[_name(line)] = line
    return pins


def runtime_requirements(repo: Path = REPO) -> list[str]:
    """The bloomline distributions' declared runtime dependencies (no extras, no torch, none
    of their own), each as the pin ``requirements-dev.txt`` gives it, else as declared."""
    import tomllib  # 3.11+: only ``make wheelhouse`` calls this, in the project's venv

    pins = _pins(repo / "requirements-dev.txt")
    own = set(DISTRIBUTIONS.values())
    wanted: dict[str, str] = {}
    for folder in DISTRIBUTIONS:
        project = tomllib.loads((repo / "packages" / folder / "pyproject.toml").read_text())
        for requirement in project["project"].get("dependencies", []):
            name = _name(requirement)
            if name in own or name in NOT_DOWNLOADED:
                continue
            wanted[name] = pins.get(name, requirement.split(";", 1)[0].strip())
    return [wanted[name] for name in sorted(wanted)]


def source_digest(roots: list[Path]) -> str:
    """sha256 over the Python files under the ``bloomline/<package>`` folders ``roots`` (path
    relative to its root, then bytes): equal for a checkout and an installed copy of the same
    code (a wheel leaves out the READMEs that live beside the modules)."""
    digest = hashlib.sha256()
    for root in sorted(roots, key=lambda p: p.name):
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        for path in files:
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def checkout_digest(repo: Path = REPO) -> str:
    """:func:`source_digest` of this checkout's ``packages/*/src/bloomline/*``."""
    return source_digest([repo / "packages" / f / "src" / "bloomline" / f for f in DISTRIBUTIONS])


def build_wheels(wheelhouse: Path, repo: Path = REPO, env: dict | None = None) -> None:
    """The four bloomline wheels of this checkout into ``wheelhouse``. Each package's
    setuptools ``build/`` folder is removed first: setuptools copies modules into it and never
    deletes one, so a module since moved or removed (``data.py`` became ``data/``) would ship
    in the wheel beside its replacement."""
    import shutil

    for name in DISTRIBUTIONS:
        shutil.rmtree(repo / "packages" / name / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(wheelhouse),
                    *(f"packages/{name}" for name in DISTRIBUTIONS)],
                   cwd=repo, check=True, timeout=600, env=env)


def record(wheelhouse: Path, repo: Path = REPO) -> Path:
    """Write ``wheelhouse/SOURCE.json`` (the sources' digest, the commit) after the wheels."""
    commit = subprocess.run(["git", "--no-optional-locks", "rev-parse", "--short", "HEAD"],
                            cwd=repo, capture_output=True, text=True).stdout.strip()
    path = Path(wheelhouse) / SOURCE_FILE
    path.write_text(json.dumps({"digest": checkout_digest(repo), "commit": commit or "unknown",
                                "python": "{}.{}".format(*sys.version_info[:2])}, indent=1) + "\n")
    return path


def main(argv: list[str]) -> int:
    if argv[:1] == ["requirements"] and len(argv) == 1:
        print("\n".join(runtime_requirements()))
        return 0
    if argv[:1] == ["wheels"] and len(argv) == 2:
        build_wheels(Path(argv[1]))
        return 0
    if argv[:1] == ["record"] and len(argv) == 2:
        print(f"wheelhouse: wrote {record(Path(argv[1]))}")
        return 0
    print("usage: python -m benchmarks.gpu_checks.wheelhouse requirements | wheels DIR | "
          "record DIR",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
