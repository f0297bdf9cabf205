"""Paths checked to be what a reader expects before it opens them, so no read blocks forever.

``open()`` of a FIFO waits for a writer, and a read of a character device (``/dev/zero``) never
ends; Python's signal handlers run only between bytecodes, so a process stuck there ignores
SIGINT and SIGTERM. Every file a tool reads by path (a corpus's token files, an index cache's
arrays, a checkpoint's files, a tokenizer, a config) goes through ``require_regular_file``
first; ``open_regular`` also closes the gap between the check and the open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bloomline.common.errors import UserError

__all__ = ["describe_kind", "open_regular", "require_directory", "require_regular_file"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"))


def describe_kind(mode: int) -> str:
    """``st_mode``'s kind in words ("a FIFO (named pipe)", "a folder", ...)."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def require_regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` (symlinks followed) if it is a regular file; else a one-line ``UserError``
    naming it and what it is instead. ``what`` names the file's role ("index cache array")."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the {what}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: the {what} is {describe_kind(mode)}, not a regular file")
    return path


def require_directory(path: str | os.PathLike, what: str = "folder") -> Path:
    """``path`` if it is a folder (symlinks followed); else a one-line ``UserError``."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    if not stat.S_ISDIR(mode):
        raise UserError(f"{path}: the {what} is {describe_kind(mode)}, not a folder")
    return path


def open_regular(path: str | os.PathLike, what: str = "file", mode: str = "rb"):
    """``open(path, mode)`` for reading that never blocks on a FIFO: opened non-blocking,
    checked with ``fstat`` (no gap between check and open), then handed back as a normal
    blocking file object. Raises ``UserError`` as ``require_regular_file``."""
    if any(flag in mode for flag in "wax+"):
        raise ValueError(f"open_regular reads; mode {mode!r} writes")
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the {what}: {error.strerror}") from None
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            raise UserError(f"{path}: the {what} is {describe_kind(st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        return open(fd, mode, closefd=True)
    except BaseException:
        os.close(fd)
        raise
