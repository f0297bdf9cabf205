"""Atomic outputs: nothing half-written is ever visible under its final name.

Outputs are written under a temporary name in the destination folder (same filesystem, so the
final ``os.replace`` is atomic) and renamed when complete. A crash, Ctrl-C or ``kill -9``
leaves at most a hidden ``.partial`` file or folder, never a file that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from bloomline.common.errors import UserError

__all__ = [
    "atomic_output_dir",
    "atomic_write_bytes",
    "check_can_write",
    "publish",
]


def check_can_write(paths: Iterable[str | os.PathLike], overwrite: bool) -> None:
    """Refuse to clobber existing outputs unless ``overwrite`` is set.

    Raises:
        UserError: naming the first output that already exists.
    """
    if overwrite:
        return
    for path in paths:
        if os.path.exists(path):
            raise UserError(f"{path}: output exists; pass --overwrite to replace it")


@contextlib.contextmanager
def atomic_output_dir(final_dir: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """A private scratch folder next to the outputs, removed on exit whatever happens.

    Build outputs inside it, then move them into place with :func:`publish` before the
    block ends. The folder is hidden (leading dot) and ends in ``.partial`` so that a run
    killed with ``-9`` leaves nothing that a reader could mistake for a finished output.
    """
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{prefix}.", suffix=".partial", dir=final_dir))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def publish(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a finished temporary file to its final name with ordinary permissions.

    ``mkstemp`` creates files readable by their owner only; an output shared by a team (or by
    ranks running as another user) must get the mode a plain ``open()`` would have given it.
    """
    os.chmod(tmp, _default_file_mode())
    os.replace(tmp, final)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        publish(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
