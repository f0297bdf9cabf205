"""Atomic outputs: nothing half-written is ever visible under its final name.

Outputs are written under a temporary name in the destination folder (same filesystem, so the
final ``os.replace`` is atomic) and renamed when complete. A crash, Ctrl-C or ``kill -9``
leaves at most a hidden ``.partial`` file or folder, never a file that looks complete.

``--overwrite`` replaces an earlier output of the same kind, never anything else: a command
that writes a folder replaces only a folder that holds that kind's files and no others
(``check_replaceable_dir``). A typo that names a run folder, a checkpoint, a corpus or a home
folder as the output is refused with one line, however the flag was given.
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
    "check_replaceable_dir",
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


def check_replaceable_dir(path: str | os.PathLike, overwrite: bool, kind: str,
                          required: Iterable[str], allowed: Iterable[str] = ()) -> None:
    """The rule for an output folder: what may be written at ``path``.

    - Nothing there, or an empty folder: written.
    - A folder of this ``kind`` (every name of ``required`` in it, and nothing but
      ``required`` and ``allowed``, the names the command writes): replaced with
      ``overwrite``, else refused (``output exists; pass --overwrite``).
    - Anything else: refused, with or without ``overwrite``, naming what does not belong (a
      file, a run folder, a checkpoint, a folder someone added files to). Those are deleted
      by hand or not at all.

    Args:
        path: The output folder.
        overwrite: Whether ``--overwrite`` was given.
        kind: What the command writes, for the message (e.g. "transformers export").
        required: Names every output of this kind holds (e.g. config.json, model.safetensors).
        allowed: Further names the command may write.

    Raises:
        UserError: One line naming ``path`` and why it is not written.
    """
    path = Path(path)
    if not os.path.lexists(path) or (path.is_dir() and not path.is_symlink()
                                     and not any(path.iterdir())):
        return
    required = tuple(required)
    what = f"a {kind} ({' + '.join(required)})"
    if path.is_symlink() or not path.is_dir():
        raise UserError(f"{path}: not replaced: --overwrite replaces a folder holding {what}, "
                        f"and this is {'a link' if path.is_symlink() else 'a file'}; remove it "
                        "yourself or choose another output")
    names = sorted(entry.name for entry in path.iterdir())
    missing = [name for name in required if name not in names]
    foreign = [name for name in names if name not in {*required, *allowed}]
    if missing or foreign:
        why = (f"it lacks {', '.join(missing)}" if missing else "") + (
            "; " if missing and foreign else "") + (
            f"it also holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}"
            if foreign else "")
        raise UserError(f"{path}: not replaced: --overwrite replaces only a folder holding "
                        f"{what} and nothing else, and {why}; remove it yourself or choose "
                        "another output")
    if not overwrite:
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
