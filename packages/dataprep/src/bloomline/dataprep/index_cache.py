"""A content-addressed cache of index arrays, built once and shared by every rank.

An entry is a folder ``CACHE/KIND-SPLIT-HASH/`` holding ``.npy`` arrays and a
``description.json`` that records every input the arrays depend on and each array's shape and
dtype. HASH is a hash of that description, so any change of input (a rewritten ``.idx``, a
different seed, L, split, sample count, weight or extra-token setting) names another entry.

Concurrency: a reader first tries the entry without locking (the common, all-ranks case).
If it is missing or invalid, the reader takes an exclusive ``flock`` on
``.locks/KIND-SPLIT-HASH.lock`` and looks again: the first process to get the lock builds
the arrays in a hidden scratch folder and renames the whole folder into place (atomic); the
others wait on the lock, then find the finished entry and memory-map it. A node without a
shared filesystem builds its own copy, identical because the build is deterministic.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CacheEntry", "cached_arrays", "entry_key", "file_identity"]

# bump when the arrays or their layout change, so old entries are not reused
CACHE_FORMAT = 1
_DESCRIPTION = "description.json"


def file_identity(path: str | os.PathLike) -> str:
    """A hash of a file's bytes: a copied or moved ``.idx`` keeps its identity, a rewritten
    one changes it, whatever the timestamps say. Index files are small (12 bytes per
    sequence), so hashing one takes milliseconds per million documents."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
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


def cached_arrays(cache_dir: str | os.PathLike, name: str, description: dict,
                  build: Callable[[], tuple[dict[str, np.ndarray], dict]]) -> CacheEntry:
    """The entry for ``description``, built with ``build()`` under the lock when missing.

    Args:
        cache_dir: the cache folder (created when needed).
        name: readable part of the entry name, e.g. ``gpt-train-wiki``.
        description: every input the arrays depend on (JSON-serializable).
        build: returns the arrays and extra JSON metadata (counts for the report).
    """
    cache_dir = Path(cache_dir)
    key = entry_key(description)
    path = cache_dir / f"{name}-{key}"
    entry, problem = _load(path, description)
    if entry is not None:
        return entry
    locks = cache_dir / ".locks"  # lock files stay (deleting one races with its next user)
    locks.mkdir(parents=True, exist_ok=True)
    with _locked(locks / f"{name}-{key}.lock"):
        entry, problem = _load(path, description)  # built by another process meanwhile?
        if entry is not None:
            return entry
        if problem is not None:
            print(f"warning: {path}: {problem}; rebuilding it", file=sys.stderr)
            _remove(path)
        arrays, metadata = build()
        _publish(path, description, arrays, metadata)
    entry, problem = _load(path, description)
    if entry is None:
        raise OSError(f"{path}: cache entry unreadable right after writing it: {problem}")
    entry.status = "built"
    return entry


def _load(path: Path, description: dict) -> tuple[CacheEntry | None, str | None]:
    """(entry, None) when valid; (None, reason) when present but invalid; (None, None) when
    absent."""
    try:
        with open(path / _DESCRIPTION) as fh:
            stored = json.load(fh)
    except FileNotFoundError:
        return None, None if not path.exists() else "description.json is missing"
    except (OSError, ValueError) as error:
        return None, f"unreadable description.json ({error})"
    if stored.get("description") != json.loads(json.dumps(description)):
        return None, "description.json does not match the inputs it is named after"
    arrays = {}
    for array_name, spec in stored.get("arrays", {}).items():
        array_path = path / f"{array_name}.npy"
        try:
            array = np.load(array_path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            return None, f"{array_name}.npy is unreadable or truncated ({error})"
        if list(array.shape) != spec["shape"] or str(array.dtype) != spec["dtype"]:
            return None, (f"{array_name}.npy is {array.dtype}{list(array.shape)}, its "
                          f"description says {spec['dtype']}{spec['shape']}")
        arrays[array_name] = array
    return CacheEntry(path, arrays, stored.get("metadata", {}), "reused"), None


def _publish(path: Path, description: dict, arrays: dict[str, np.ndarray],
             metadata: dict) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial",
                                    dir=path.parent))
    try:
        for array_name, array in arrays.items():
            np.save(scratch / f"{array_name}.npy", array, allow_pickle=False)
        stored = {
            "description": description,
            "arrays": {n: {"shape": list(a.shape), "dtype": str(a.dtype)}
                       for n, a in arrays.items()},
            "metadata": metadata,
        }
        # written last: an entry without it is never mistaken for a complete one
        (scratch / _DESCRIPTION).write_text(json.dumps(stored, indent=1, sort_keys=True))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(scratch, 0o777 & ~umask)  # mkdtemp makes it private; ranks may be others
        for child in scratch.iterdir():
            os.chmod(child, 0o666 & ~umask)
        os.rename(scratch, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _remove(path: Path) -> None:
    """Move a bad entry out of the way first, so no reader sees it half-deleted."""
    trash = path.with_name(f".{path.name}.{os.getpid()}.trash")
    with contextlib.suppress(FileNotFoundError):
        os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if the holder dies
        yield
    finally:
        os.close(fd)
