"""``python3 -m benchmarks.gpu_check`` as it runs on a GPU machine without network, simulated on
this CPU: a Python that already has torch and the scientific packages but not bloomline (an
"image"), bloomline's wheels in a wheelhouse built from this checkout, pip's index switched off.

The image is a fresh venv whose extra site folder (a ``.pth`` line) holds links to everything
the test's own environment has installed except bloomline and its editable hooks, and except
what a test hides from it. A folder named by a ``.pth`` line is not itself scanned for ``.pth``
files, so nothing of the editable install leaks in. pip runs with ``PIP_NO_INDEX`` and no
config file: anything that would reach an index fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from benchmarks.gpu_checks.wheelhouse import SOURCE_FILE, build_wheels

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONPATH": ""}
# what an image never has of ours: the packages, their metadata, the editable install's hooks
OURS = ("bloomline", "_bloomline", "__editable__")


def _image(root: Path, hide: tuple[str, ...] = ()) -> Path:
    """A venv at ``root`` seeing this environment's packages but bloomline's and ``hide``'s
    (distribution or module name prefixes); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    deps = root / "site"
    deps.mkdir()
    ours = sysconfig.get_paths()["purelib"]
    for entry in Path(ours).iterdir():
        name = entry.name.lower()
        if entry.suffix == ".pth" or name.startswith(OURS) or name.startswith(hide):
            continue
        (deps / entry.name).symlink_to(entry)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    # after the venv's own packages: its pip and setuptools stay the ones it came with
    (Path(purelib.stdout.strip()) / "image_packages.pth").write_text(f"{deps}\n")
    return python


def _run(python: Path, *args: str, env: dict | None = None, timeout: float = 600):
    return subprocess.run([str(python), "-m", "benchmarks.gpu_check", *args], cwd=REPO,
                          env={**os.environ, **OFFLINE, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """The bloomline part of ``make wheelhouse``, offline: this checkout's four wheels and
    ``SOURCE.json``."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    build_wheels(folder, REPO, env={**os.environ, **OFFLINE})
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_checks.wheelhouse", "record",
                    str(folder)], cwd=REPO, check=True, timeout=120)
    return folder


@pytest.fixture(scope="module")
def image(tmp_path_factory, wheelhouse) -> Path:
    """An image into which the check has installed bloomline from the wheelhouse."""
    python = _image(tmp_path_factory.mktemp("image"))
    done = _run(python, "--setup-only", "--wheelhouse", str(wheelhouse))
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def test_setup_installs_the_wheels_with_no_deps_and_no_index(image):
    """Catches: the check reaching for an index (it would fail here: PIP_NO_INDEX), installing
    bloomline's dependencies over the image's, or leaving bloomline imported from somewhere
    other than the installed wheels."""
    where = subprocess.run([str(image), "-c", "import bloomline.trainer, bloomline.dataprep; "
                            "print(bloomline.trainer.__file__)"], capture_output=True, text=True,
                           env={**os.environ, **OFFLINE}, cwd="/", timeout=300)
    assert where.returncode == 0, where.stderr
    assert str(image.parents[1] / "lib") in where.stdout  # the image venv's own site-packages
    assert "packages/trainer/src" not in where.stdout
    again = _run(image, "--setup-only")  # installed and current: nothing to do, no wheelhouse
    assert again.returncode == 0, again.stderr
    assert "installing" not in again.stdout


def test_without_a_gpu_the_image_exits_2_with_one_line(image):
    """Catches: the installed check failing differently from the development one on a machine
    without CUDA (a traceback from a missing module, a table of failures, exit 0)."""
    done = _run(image, env={"CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("gpu_check: no usable CUDA GPU: torch ")


@pytest.mark.slow
def test_the_cpu_dry_run_of_every_check_passes_in_the_image(image, tmp_path):
    """Catches: a check whose plumbing breaks once bloomline is installed from wheels rather
    than edited in place (a console script assumed in a venv's bin/, a path into packages/, a
    module the wheels leave out), and a results file missing a check or its time."""
    done = _run(image, "--cpu-dry-run", "--results", str(tmp_path / "dry"), timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "dry.json").read_text())
    assert set(result["timing"]) == {"a", "b", "c", "d"}
    assert [row["status"] for row in result["rows"]] == ["pass"] * len(result["rows"])
    names = " ".join(row["name"] for row in result["rows"])
    for part in ("flex-alibi", "run of tiny-cpu", "plan beside", "dp2", "tp2", "throughput"):
        assert part in names
    assert "| check | status |" in (tmp_path / "dry.md").read_text()


def test_a_missing_dependency_is_one_line_naming_it_and_the_command(tmp_path, wheelhouse):
    """Catches: an image without one of bloomline's dependencies getting a traceback at the
    first import, a silent attempt at the network, or a message that does not say what to
    run. zstandard: one a typical GPU image lacks, and not in this wheelhouse."""
    python = _image(tmp_path, hide=("zstandard",))
    done = _run(python, "--setup-only", "--wheelhouse", str(wheelhouse))
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "zstandard" in line and "make wheelhouse" in line


def test_a_wheelhouse_of_other_sources_is_refused_before_installing(tmp_path, wheelhouse):
    """Catches: wheels of an older checkout installed under this checkout's check (the GPU run
    would test code that is not the one in front of the user)."""
    stale = tmp_path / "stale"
    shutil.copytree(wheelhouse, stale)
    record = json.loads((stale / SOURCE_FILE).read_text())
    (stale / SOURCE_FILE).write_text(json.dumps({**record, "digest": "0" * 64}))
    python = _image(tmp_path / "image")
    done = _run(python, "--setup-only", "--wheelhouse", str(stale))
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert "built from other sources" in line and "make wheelhouse" in line
    assert "installing" not in done.stdout


def test_an_older_python_is_refused_in_one_line():
    """Catches: Python 3.10 (Ubuntu 22.04's) getting a SyntaxError or an ImportError of
    tomllib deep in the checks instead of the one line that says 3.11 is needed."""
    # pyenv's own folder first: its shim on PATH exists but refuses to run an inactive version
    found = [*map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")),
             *filter(None, [shutil.which("python3.10")])]
    old = next((p for p in found if subprocess.run([p, "-c", ""], capture_output=True,
                                                   timeout=60).returncode == 0), None)
    if old is None:
        pytest.skip("no Python 3.10 on this machine")
    done = subprocess.run([old, "-m", "benchmarks.gpu_check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "older than bloomline's 3.11" in line


@pytest.mark.slow
def test_wheels_leave_out_modules_that_left_the_sources(tmp_path):
    """Bug: setuptools' build/ folder keeping a module the sources no longer have (data.py
    after it became data/), so that the wheel ships both, its digest differs from the checkout's
    and the GPU machine refuses it as "imported from elsewhere"."""
    import zipfile

    stale = REPO / "packages" / "tools" / "build" / "lib" / "bloomline" / "tools" / "gone.py"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("raise ImportError('a module the sources no longer have')\n")
    build_wheels(tmp_path, REPO, env={**os.environ, **OFFLINE})
    (tools,) = tmp_path.glob("bloomline_tools-*.whl")
    assert not [name for name in zipfile.ZipFile(tools).namelist() if name.endswith("gone.py")]
    assert not stale.exists()
