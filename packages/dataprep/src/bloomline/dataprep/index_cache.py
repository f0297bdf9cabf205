"""A content-addressed cache of index arrays, built once and shared by every rank.

An entry is a folder ``CACHE/KIND-SPLIT-HASH/`` holding ``.npy`` arrays and a
``description.json`` that records every input the arrays depend on and each array's shape and
dtype. HASH is a hash of that description, so any change of input (a rewritten ``.idx``, a
different seed, L, split, sample count, weight or extra-token setting) names another entry.

Loading checks an entry against what it was built from: the description it is named after,
each array's shape and dtype, and (through the caller's ``check``) the values, so that a
truncated or tampered file is named in one line and rebuilt instead of sending a reader (the
compiled batch gather) outside its arrays. Where the cache folder cannot be written, the line
is an error that says to delete the entry (or use another cache folder).

Concurrency: a reader first tries the entry without locking (the common, all-ranks case).
If it is missing or invalid, the reader takes an exclusive ``flock`` on
``.locks/KIND-SPLIT-HASH.lock`` and looks again: the first process to get the lock builds
the arrays in a hidden scratch folder and renames the whole folder into place (atomic); the
others wait on the lock, then find the finished entry and memory-map it. A node without a
shared filesystem builds its own copy, identical because the build is deterministic.

Hostile state: every file of an entry is checked to be a regular file before it is opened (a
FIFO would block ``open`` forever, beyond the reach of SIGINT and SIGTERM); an entry holding
something else is refused in one line, never deleted, as it is not something the cache wrote.
A symlinked entry that must be rebuilt loses the link, never the content it points to. A write
that fails (a full disk) names the file and removes the scratch folder, so nothing partial is
left under the entry's name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import describe_kind, open_regular

__all__ = ["CacheEntry", "Check", "cached_arrays", "entry_key", "file_identity", "read_entry"]

# bump when the arrays or their layout change, so old entries are not reused
CACHE_FORMAT = 1
_DESCRIPTION = "description.json"


def file_identity(path: str | os.PathLike) -> str:
    """A hash of a file's bytes: a copied or moved ``.idx`` keeps its identity, a rewritten
    one changes it, whatever the timestamps say. Index files are small (12 bytes per
    sequence), so hashing one takes milliseconds per million documents."""
    digest = hashlib.blake2b(digest_size=16)
    with open_regular(path, "token index") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def entry_key(description: dict) -> str:
    text = json.dumps({"format": CACHE_FORMAT, **description}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


@dataclass
class CacheEntry:
    """Arrays loaded (memory-mapped) from an entry, with the metadata stored beside them."""

    path: Path
    arrays: dict[str, np.ndarray]
    metadata: dict
    status: str  # "built" or "reused"


# (arrays, metadata) -> None when the values are sound, else what is wrong, starting with the
# array's file name (e.g. "shuffle_index.npy: ..."); given by the kind of index (build_index)
Check = Callable[[dict[str, np.ndarray], dict], "str | None"]


def cached_arrays(cache_dir: str | os.PathLike, name: str, description: dict,
                  build: Callable[[], tuple[dict[str, np.ndarray], dict]],
                  check: Check | None = None) -> CacheEntry:
    """The entry for ``description``, built with ``build()`` under the lock when missing.

    Args:
        cache_dir: the cache folder (created when needed).
        name: readable part of the entry name, e.g. ``gpt-train-wiki``.
        description: every input the arrays depend on (JSON-serializable).
        build: returns the arrays and extra JSON metadata (counts for the report).
        check: the value checks of a loaded entry (see :data:`Check`); a failing entry is
            named in a warning and rebuilt.

    Raises:
        UserError: an invalid entry that cannot be rebuilt because the cache folder is not
            writable, naming the file and what to delete.
    """
    cache_dir = Path(cache_dir)
    key = entry_key(description)
    path = cache_dir / f"{name}-{key}"
    entry, problem = _load(path, description, check)
    if entry is not None:
        return entry
    try:
        locks = cache_dir / ".locks"  # lock files stay (deleting one races with its next user)
        locks.mkdir(parents=True, exist_ok=True)
        with _locked(locks / f"{name}-{key}.lock"):
            entry, problem = _load(path, description, check)  # built by another process?
            if entry is not None:
                return entry
            if problem is not None:
                print(f"warning: {path}/{problem}; rebuilding the cache entry", file=sys.stderr)
                _remove(path)
            arrays, metadata = build()
            _publish(path, description, arrays, metadata)
    except OSError as error:
        if problem is None or error.errno not in _READ_ONLY:
            raise
        raise UserError(f"{path}/{problem}; cannot rebuild it here ({error.strerror}): delete "
                        f"{path} or give another --cache-dir") from None
    entry, problem = _load(path, description, check)
    if entry is None:
        raise OSError(f"{path}/{problem}: cache entry unreadable right after writing it")
    entry.status = "built"
    return entry


_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def read_entry(path: str | os.PathLike, check_for: Callable[[dict], Check | None]
               ) -> tuple[dict | None, CacheEntry | None, str | None]:
    """An entry found on disk, checked without knowing its inputs beforehand (``inspect-data
    verify``): its stored description must hash to its name, and ``check_for(description)``
    gives the value checks for the inputs it names (None: not checked).

    Returns:
        (description or None when unreadable, entry or None, problem or None); a problem
        starts with the file name inside the entry.
    """
    path = Path(path)
    try:
        _present(path / _DESCRIPTION, "description")
        with open_regular(path / _DESCRIPTION, "index cache description", "r") as fh:
            description = json.load(fh)["description"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, None, f"{_DESCRIPTION}: missing or unreadable ({error})"
    if not isinstance(description, dict) or not path.name.endswith(f"-{entry_key(description)}"):
        return None, None, f"{_DESCRIPTION}: does not match the inputs its entry is named after"
    entry, problem = _load(path, description, check_for(description))
    return description, entry, problem


def _load(path: Path, description: dict, check: Check | None = None
          ) -> tuple[CacheEntry | None, str | None]:
    """(entry, None) when valid; (None, reason) when present but invalid; (None, None) when
    absent. A reason starts with the file inside the entry that is at fault.

    Raises:
        UserError: a file of the entry that is not a regular file (a FIFO, a device).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise UserError(f"{path}: the index cache entry is {describe_kind(mode)}, not a "
                        "folder; remove it yourself (it is rebuilt) or use another cache folder")
    if not _present(path / _DESCRIPTION, "description"):
        return None, None if not os.path.lexists(path) else f"{_DESCRIPTION}: missing"
    try:
        with open_regular(path / _DESCRIPTION, "index cache description", "r") as fh:
            stored = json.load(fh)
    except (OSError, ValueError) as error:
        return None, f"{_DESCRIPTION}: unreadable ({error})"
    if not isinstance(stored, dict) or (
            stored.get("description") != json.loads(json.dumps(description))):
        return None, f"{_DESCRIPTION}: does not match the inputs it is named after"
    arrays = {}
    specs = stored.get("arrays")
    if not isinstance(specs, dict):
        return None, f"{_DESCRIPTION}: lists no arrays"
    for array_name, spec in specs.items():
        array_path = path / f"{array_name}.npy"
        # np.load opens by name: checked first, or a FIFO there blocks it for good
        if not _present(array_path, "array"):
            return None, f"{array_name}.npy: missing"
        try:
            array = np.load(array_path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            return None, f"{array_name}.npy: unreadable or truncated ({error})"
        if not isinstance(spec, dict) or (
                [list(array.shape), str(array.dtype)] != [spec.get("shape"), spec.get("dtype")]):
            return None, (f"{array_name}.npy: {array.dtype}{list(array.shape)}, its "
                          f"description says {spec}")
        arrays[array_name] = array
    metadata = stored.get("metadata", {})
    if check is not None:
        try:
            problem = check(arrays, metadata)
        except (KeyError, TypeError, ValueError, IndexError) as error:  # a missing array...
            problem = f"{_DESCRIPTION}: does not describe this kind of index ({error!r})"
        if problem is not None:
            return None, problem
    return CacheEntry(path, arrays, metadata, "reused"), None


def _present(path: Path, what: str) -> bool:
    """Whether the entry's file ``path`` exists (symlinks followed): False when absent, True
    for a regular file; anything else (a FIFO, a device, a folder) is refused, not deleted."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: the index cache {what} is {describe_kind(mode)}, not a "
                        f"regular file; remove {path.parent} yourself (it is rebuilt) or use "
                        "another cache folder")
    return True


def _written(file: Path, write: Callable[[], object]) -> None:
    """``write()`` of ``file``, an error naming the file when it fails: numpy and
    ``write_text`` report a full disk without the file's name."""
    try:
        write()
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free = shutil.disk_usage(file.parent).free
        raise UserError(f"{file}: cannot write the index cache: {error.strerror} "
                        f"({free / 2**30:.1f} GiB free); free space there or use another "
                        "cache folder") from None


def _publish(path: Path, description: dict, arrays: dict[str, np.ndarray],
             metadata: dict) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial",
                                    dir=path.parent))
    try:
        for array_name, array in arrays.items():
            file = scratch / f"{array_name}.npy"
            _written(file, lambda file=file, array=array: np.save(file, array,
                                                                   allow_pickle=False))
        stored = {
            "description": description,
            "arrays": {n: {"shape": list(a.shape), "dtype": str(a.dtype)}
                       for n, a in arrays.items()},
            "metadata": metadata,
        }
        # written last: an entry without it is never mistaken for a complete one
        file = scratch / _DESCRIPTION
        _written(file, lambda: file.write_text(json.dumps(stored, indent=1, sort_keys=True)))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(scratch, 0o777 & ~umask)  # mkdtemp makes it private; ranks may be others
        for child in scratch.iterdir():
            os.chmod(child, 0o666 & ~umask)
        os.rename(scratch, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _remove(path: Path) -> None:
    """Move a bad entry out of the way first, so no reader sees it half-deleted. A symlink
    (an entry kept elsewhere) is removed as a link: what it points to is not ours to delete."""
    trash = path.with_name(f".{path.name}.{os.getpid()}.trash")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    if trash.is_symlink() or not trash.is_dir():
        trash.unlink()
    else:
        shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # non-blocking open, then checked: a FIFO or device put there would block or misbehave
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{lock_path}: the index cache lock is {describe_kind(mode)}, not "
                            "a regular file; remove it yourself")
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if the holder dies
        yield
    finally:
        os.close(fd)
