"""Make the Python running ``python3 -m benchmarks.gpu_check`` able to run the checks, offline.

The GPU check runs with the machine's own Python, the one whose torch has CUDA (a cluster's
module, a cloud image's ``python3``), not with ``make test``'s ``.venv`` (the CPU build). Such a
machine often has no network. So nothing here reaches an index: pip always runs with
``--no-index``, and what the Python lacks comes from ``wheelhouse/`` (``make wheelhouse`` on a
machine with network; ``wheelhouse.py``).

In order, :func:`prepare`:

1. the Python is 3.11 or newer and has torch (:func:`interpreter_problem`: the one line);
2. bloomline is importable and its code is this checkout's: an editable install of this
   checkout (``make test``'s ``.venv``) is taken as it is; otherwise the four distributions
   are installed from the wheelhouse's wheels with ``--no-deps`` (reinstalled when the
   installed copy's sources differ from the checkout's), provided the wheelhouse was built
   from the same sources (``SOURCE.json``);
3. every dependency the distributions declare is installed and recent enough (``pip check``,
   which judges versions and markers as pip does); what is not is installed from the
   wheelhouse, by the declared requirement, so nothing the image has is replaced needlessly.
   torch out of the declared range is a warning, not a replacement.

Each action is one line on stdout (``gpu_check: installing ...``). A problem is one line that
names what is missing and the command that provides it; :func:`prepare` returns it.

Standard library only, and no syntax newer than Python 3.8: this module runs before the
Python's version is known to be enough.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_checks.wheelhouse import (
    DISTRIBUTIONS,
    REPO,
    SOURCE_FILE,
    checkout_digest,
    source_digest,
)

__all__ = ["MIN_PYTHON", "PROVIDE", "WHEELHOUSE", "interpreter_problem", "prepare"]

MIN_PYTHON = (3, 11)
WHEELHOUSE = REPO / "wheelhouse"
PROVIDE = ("on a machine with network, in a checkout of the same commit: make wheelhouse "
           "WHEEL_PYTHON={python}; then copy its wheelhouse/ folder into this checkout")


def _say(line: str) -> None:
    print(f"gpu_check: {line}", flush=True)


def _provide() -> str:
    return PROVIDE.format(python="{}.{}".format(*sys.version_info[:2]))


def interpreter_problem() -> str | None:
    """Why this Python cannot run the checks at all (too old, no torch), else None."""
    if sys.version_info[:2] < MIN_PYTHON:
        return (f"Python {sys.version.split()[0]} ({sys.executable}) is older than bloomline's "
                f"3.11: run the check with a Python 3.11 or newer that has a CUDA build of torch")
    if importlib.util.find_spec("torch") is None:
        return (f"{sys.executable} has no torch: run the check with the Python that has the "
                f"machine's CUDA build of torch (e.g. the image's python3)")
    return None


def _pip(*args: str) -> tuple[bool, str]:
    """``python -m pip ARGS`` (never an index); (succeeded, its last line of output)."""
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                           "--no-input", *args], capture_output=True, text=True)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and not line.startswith("WARNING: Location")]
    return done.returncode == 0, (lines[-1].strip() if lines else f"exit {done.returncode}")


def _installed_roots() -> list[Path] | None:
    """Where this Python imports ``bloomline.<package>`` from, for each of the four; None
    when any is missing."""
    roots = []
    for folder in DISTRIBUTIONS:
        try:
            spec = importlib.util.find_spec(f"bloomline.{folder}")
        except ImportError:
            spec = None
        if spec is None or not spec.submodule_search_locations:
            return None
        roots.append(Path(list(spec.submodule_search_locations)[0]))
    return roots


def _bloomline_problem(wheelhouse: Path) -> str | None:
    """Step 2: bloomline importable, from this checkout's sources."""
    roots = _installed_roots()
    checkout = REPO / "packages"
    if roots is not None and all(checkout in root.resolve().parents for root in roots):
        return None  # an editable install of this very checkout: its code is the checkout
    want = checkout_digest()
    if roots is not None and source_digest(roots) == want:
        return None  # installed from wheels of the same sources
    built = wheelhouse / SOURCE_FILE
    if not built.is_file():
        what = "bloomline is not installed" if roots is None else \
            f"the installed bloomline ({roots[0].parent}) is not this checkout's code"
        return f"{what}, and {wheelhouse} has no bloomline wheels: {_provide()}"
    import json

    record = json.loads(built.read_text())
    if record.get("digest") != want:
        return (f"{wheelhouse} was built from other sources (commit "
                f"{record.get('commit', '?')}) than this checkout's packages/: {_provide()}")
    wheels = [str(p) for name in DISTRIBUTIONS.values()
              for p in sorted(wheelhouse.glob(name.replace("-", "_") + "-*.whl"))[-1:]]
    if len(wheels) != len(DISTRIBUTIONS):
        return f"{wheelhouse} lacks some of the four bloomline wheels: {_provide()}"
    _say(f"installing {', '.join(DISTRIBUTIONS.values())} from {wheelhouse} "
         f"(--no-deps --no-index) into {sys.prefix}")
    ok, last = _pip("install", "--no-index", "--no-deps", "--force-reinstall", *wheels)
    if not ok:
        return f"pip could not install the bloomline wheels: {last}"
    importlib.invalidate_caches()
    roots = _installed_roots()
    if roots is None or source_digest(roots) != want:
        return (f"after installing from {wheelhouse}, bloomline is still imported from "
                f"elsewhere ({roots[0].parent if roots else 'nowhere'}): check PYTHONPATH")
    return None


_CHECK_LINE = re.compile(r"^(bloomline-[a-z]+) \S+ (?:requires (?P<missing>[^,]+), which is "
                         r"not installed|has requirement (?P<old>.+), but you have "
                         r"(?P<have>.+))\.$")


def _declared(name: str) -> str:
    """The requirement a bloomline distribution declares for ``name`` (markers dropped)."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    for dist in DISTRIBUTIONS.values():
        for requirement in importlib.metadata.requires(dist) or []:
            head = re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1)
            if re.sub(r"[-_.]+", "-", head).lower() == key and "extra ==" not in requirement:
                return requirement.split(";", 1)[0].strip()
    return name


def _unmet() -> tuple[list[str], list[str]]:
    """(requirements of the bloomline distributions that ``pip check`` finds missing or too
    old, torch's own complaint if any)."""
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "check"],
                          capture_output=True, text=True)
    unmet, torch = [], []
    for line in done.stdout.splitlines():
        match = _CHECK_LINE.match(line.strip())
        if not match:
            continue  # the image's own packages' complaints are not ours to fix
        requirement = match.group("missing") or match.group("old")
        name = re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1)
        if name.lower() == "torch":
            torch.append(f"{match.group(1)} declares {requirement}, this Python has "
                         f"{match.group('have') or 'none'}")
        else:
            unmet.append(_declared(name))
    return sorted(set(unmet)), torch


def _dependencies_problem(wheelhouse: Path) -> str | None:
    """Step 3: every declared dependency there, from the wheelhouse when it was not."""
    unmet, torch = _unmet()
    for line in torch:
        _say(f"warning: {line}; the checks run with it, outside the supported range")
    if not unmet:
        return None
    if not any(wheelhouse.glob("*.whl")):
        return (f"missing Python packages (bloomline's dependencies): {', '.join(unmet)}; "
                f"{wheelhouse} has no wheels: {_provide()}")
    _say(f"installing {', '.join(unmet)} from {wheelhouse} (--no-index) into {sys.prefix}")
    ok, last = _pip("install", "--no-index", "--find-links", str(wheelhouse), *unmet)
    if not ok:
        return (f"missing Python packages: {', '.join(unmet)}; installing them from "
                f"{wheelhouse} failed ({last}): {_provide()}")
    importlib.invalidate_caches()
    unmet, _ = _unmet()
    if unmet:
        return f"still missing after installing from {wheelhouse}: {', '.join(unmet)}"
    return None


def prepare(wheelhouse: Path = WHEELHOUSE) -> str | None:
    """Steps 1-3; None when the checks can run, else the one line saying what is missing."""
    return (interpreter_problem() or _bloomline_problem(Path(wheelhouse))
            or _dependencies_problem(Path(wheelhouse)))
