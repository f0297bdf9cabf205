"""Atomic outputs: nothing half-written is ever visible under its final name.

Outputs are written under a temporary name in the destination folder (same filesystem, so the
final ``os.replace`` is atomic) and renamed when complete. A crash, Ctrl-C or ``kill -9``
leaves at most a hidden ``.partial`` file or folder, never a file that looks complete.

``--overwrite`` replaces an earlier output of the same kind, never anything else: a command
that writes a folder replaces only a folder that holds that kind's files and no others
(``check_replaceable_dir``). A typo that names a run folder, a checkpoint, a corpus or a home
folder as the output is refused with one line, however the flag was given.

An output file (a plot) follows the same rule (``check_replaceable_file``): ``--overwrite``
replaces only a file of the kind the command writes (its suffix and its first bytes), and no
command writes its file into a checkpoint, a run folder or a corpus folder
(``foreign_folder``), where a stray file breaks the checkpoint's verification, or sits among
the token files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from bloomline.common.errors import UserError

__all__ = [
    "atomic_output_dir",
    "atomic_write_bytes",
    "check_can_write",
    "check_replaceable_dir",
    "check_replaceable_file",
    "check_not_inside_foreign",
    "foreign_folder",
    "publish",
    "publish_dir",
    "publish_new",
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
        other = foreign_folder(path)
        what_it_is = f": this is {other}" if other else ""
        raise UserError(f"{path}: not replaced: --overwrite replaces only a folder holding "
                        f"{what} and nothing else, and {why}{what_it_is}; remove it yourself "
                        "or choose another output")
    if not overwrite:
        raise UserError(f"{path}: output exists; pass --overwrite to replace it")


def _has(folder: Path, name: str) -> bool:
    return os.path.lexists(folder / name)


def foreign_folder(folder: str | os.PathLike) -> str | None:
    """What ``folder`` is when it is another command's output that no file may be added to,
    in words ("a checkpoint (manifest.json, .metadata)"), else None.

    - a checkpoint: DCP's ``.metadata`` with ``manifest.json`` or ``config.toml`` (its
      verification refuses any file its manifest does not list);
    - a run folder: ``metrics.jsonl``, ``run_info.json`` or a ``checkpoints/`` folder (the
      trainer's, one writer at a time);
    - a corpus folder: a ``NAME.bin``/``NAME.idx`` pair (``build-index`` uses every pair).
    """
    folder = Path(folder)
    if _has(folder, ".metadata") and (_has(folder, "manifest.json")
                                      or _has(folder, "config.toml")):
        return "a checkpoint (.metadata, manifest.json)"
    run_marks = [name for name in ("metrics.jsonl", "run_info.json", "checkpoints")
                 if _has(folder, name)]
    if run_marks:
        return f"a run folder ({', '.join(run_marks)})"
    try:
        with os.scandir(folder) as entries:
            names = {entry.name for entry in entries}
    except OSError:
        return None
    pairs = sorted(name[:-4] for name in names
                   if name.endswith(".bin") and f"{name[:-4]}.idx" in names)
    if pairs:
        return f"a corpus folder ({pairs[0]}.bin/.idx)"
    return None


def check_not_inside_foreign(path: str | os.PathLike) -> None:
    """Refuse an output written into a checkpoint or a run folder (at any depth) or directly
    into a corpus folder (see :func:`foreign_folder`), with or without ``--overwrite``.

    Raises:
        UserError: naming ``path`` and the folder it would be written into.
    """
    path = Path(path)
    parent = Path(os.path.abspath(path)).parent
    for depth, folder in enumerate((parent, *parent.parents)):
        other = foreign_folder(folder) if folder.is_dir() else None
        if other and (depth == 0 or not other.startswith("a corpus")):
            raise UserError(f"{path}: not written: {folder} is {other}, which no command "
                            "adds files to; choose an output outside it")


def check_replaceable_file(path: str | os.PathLike, overwrite: bool, kind: str,
                           signatures: Mapping[str, Iterable[bytes]]) -> None:
    """The rule for an output file (``check_replaceable_dir``'s for files): what may be
    written at ``path``.

    - Its name must end in a suffix of ``signatures`` (e.g. ``.png``), whatever is there.
    - Inside a checkpoint, a run folder or a corpus folder: refused (``check_not_inside_foreign``).
    - Nothing there: written.
    - A regular file with that suffix that starts with one of the suffix's magic bytes (a
      file of this ``kind``): replaced with ``overwrite``, else refused
      (``output exists; pass --overwrite``).
    - Anything else (a link, a folder, a file of another kind, an ``.idx`` renamed): refused
      with or without ``overwrite``.

    Raises:
        UserError: One line naming ``path`` and why it is not written.
    """
    path = Path(path)
    magics = {suffix.lower(): tuple(m) for suffix, m in signatures.items()}
    if path.suffix.lower() not in magics:
        raise UserError(f"{path}: not written: the name must end in "
                        f"{' or '.join(magics)} (the {kind} it writes)")
    check_not_inside_foreign(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_file():
        raise UserError(f"{path}: not replaced: --overwrite replaces only a {kind} file, and "
                        f"this is {'a link' if path.is_symlink() else 'not a file'}; remove it "
                        "yourself or choose another output")
    expected = magics[path.suffix.lower()]
    with open(path, "rb") as fh:
        head = fh.read(max(len(m) for m in expected))
    if not any(head.startswith(m) for m in expected):
        raise UserError(f"{path}: not replaced: --overwrite replaces only a {kind} file, and "
                        "this one holds something else; remove it yourself or choose "
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


def publish_new(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """:func:`publish` that never replaces: a file that appeared at ``final`` since the
    command's exists-check (written by another program meanwhile) is kept and refused.

    A hard link fails atomically when the name exists, where a check before ``os.replace``
    would leave a moment in which the file could appear; filesystems without hard links
    fall back to that check.

    Raises:
        UserError: ``final`` exists.
    """
    os.chmod(tmp, _default_file_mode())
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise UserError(f"{final}: output exists (written meanwhile by another program); "
                        "pass --overwrite to replace it") from None
    except OSError:  # no hard links here (some FUSE and SMB mounts)
        if os.path.lexists(final):
            raise UserError(f"{final}: output exists (written meanwhile by another program); "
                            "pass --overwrite to replace it") from None
        os.replace(tmp, final)
        return
    os.unlink(tmp)


def publish_dir(staged: str | os.PathLike, final: str | os.PathLike,
                scratch: str | os.PathLike) -> None:
    """Move the finished folder ``staged`` to ``final``, replacing a folder there as a whole
    (no file of the old one is left beside the new ones).

    ``os.replace`` cannot replace a non-empty folder: the old one moves into ``scratch`` (an
    :func:`atomic_output_dir`, deleted on exit) first, and back should the new one not move in.
    Check what ``final`` holds with :func:`check_replaceable_dir` before.
    """
    final = Path(final)
    if not os.path.lexists(final):
        os.replace(staged, final)
        return
    replaced = Path(scratch) / ".replaced"
    os.replace(final, replaced)
    try:
        os.replace(staged, final)
    except BaseException:
        os.replace(replaced, final)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename; without
    ``overwrite``, a file that appeared at ``path`` meanwhile is refused (:func:`publish_new`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        (publish if overwrite else publish_new)(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
