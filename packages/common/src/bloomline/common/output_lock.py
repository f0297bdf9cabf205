"""One writer per output: an advisory lock on a hidden sidecar next to the output.

The exists-check a command makes when it starts cannot see another run of the same command
that started a moment earlier and has not written yet: both would pass it, and the later to
finish would replace the other's files while both exit 0. So every command that writes an
output holds ``DIR/.NAME.lock`` (for the output ``DIR/NAME``: a prefix, a file or a folder)
from before its exists-check until its files are in place. The lock is an ``flock``, taken
without waiting: a second writer is refused at once with one line naming the holder's pid.
The kernel drops it when the holder dies, however it dies (``kill -9`` too), so a killed run
never blocks the next one; a clean exit also removes the sidecar.

Removing the sidecar while another process may be opening it is safe because the holder
removes it while still holding the lock, and whoever locks a file checks afterwards that the
path still names that file (else it locks again): two processes never hold two different
files of the same name.

Nested holds in one thread are one hold: a command holds its outputs' locks for its whole
run (token files, then the records beside them), and the writer of the token files takes the
same lock for its own life, which must not refuse its own process.

Filesystems without ``flock`` (Lustre mounted without ``-o flock``, some FUSE mounts) cannot
lock; there the command runs without the lock, as it did before the lock existed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import describe_kind

__all__ = ["OutputLock", "lock_path", "output_lock", "output_locks"]

# filesystems where flock is not supported: run unlocked there (nothing to protect with)
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
# (sidecar, thread) -> [descriptor or None (unsupported), holds]: the locks this process
# holds; another thread of the process is another writer (its own descriptor: refused/waits)
_HELD: dict[tuple[Path, int], list] = {}


def lock_path(output: str | os.PathLike) -> Path:
    """The sidecar of ``output``: ``DIR/.NAME.lock`` beside it (never inside a folder output,
    so that the folder holds only what the command writes)."""
    output = Path(os.path.abspath(output))
    return output.with_name(f".{output.name}.lock")


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(path.read_text().strip())
        return f"another process (pid {pid})"
    return "another process"


def _acquire(output: str | os.PathLike, path: Path, wait: bool) -> tuple[int, Path] | None:
    """(descriptor, sidecar) holding the lock of ``output``; None where flock is unsupported.

    Raises:
        UserError: another live process holds it (not ``wait``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        # non-blocking open, then checked: a FIFO put there would block the open forever
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise UserError(f"{path}: the lock of {output} is {describe_kind(mode)}, not a "
                            "regular file; remove it yourself")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{_holder(path)} is writing {output}; wait for it to finish "
                            "or choose another output") from None
        except OSError as error:
            os.close(fd)
            if error.errno in _UNSUPPORTED:
                return None
            raise
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        held = os.fstat(fd)
        if now is not None and (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd, path
        os.close(fd)  # its holder removed it between our open and our lock: take the new one


class OutputLock:
    """A hold of the lock of ``output`` (a prefix ``corpus/NAME``, a file or a folder), taken
    at once or refused (or, with ``wait``, when the holder is done); :meth:`release`
    (idempotent) ends it, the last hold of this thread unlocks and removes the sidecar.

    Raises:
        UserError: "another process (pid N) is writing OUTPUT; wait for it ...".
    """

    def __init__(self, output: str | os.PathLike, wait: bool = False,
                 sidecar: str | os.PathLike | None = None) -> None:
        self.path = lock_path(output) if sidecar is None else Path(os.path.abspath(sidecar))
        self._remove = sidecar is None  # a sidecar the caller named is the caller's to keep
        self._key = (self.path, threading.get_ident())
        held = _HELD.get(self._key)
        if held is None:
            acquired = _acquire(output, self.path, wait)
            held = _HELD[self._key] = [acquired[0] if acquired else None, 0]
        held[1] += 1
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        held = _HELD[self._key]
        held[1] -= 1
        if held[1]:
            return
        del _HELD[self._key]
        if held[0] is None:
            return
        try:
            if self._remove:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # while still locked: see the module docstring
        finally:
            os.close(held[0])


@contextlib.contextmanager
def output_lock(output: str | os.PathLike, wait: bool = False,
                sidecar: str | os.PathLike | None = None) -> Iterator[None]:
    """Hold the lock of ``output`` for the block (see :class:`OutputLock`).

    ``wait``: block until the holder is done instead of refusing, for outputs that every
    process builds identically and then reads (the index cache: one builds, the others wait
    and reuse it). ``sidecar``: the lock file, where not ``DIR/.NAME.lock``; it stays after
    the block (the index cache keeps its lock files in ``.locks/``).
    """
    lock = OutputLock(output, wait, sidecar)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def output_locks(outputs: Iterable[str | os.PathLike]) -> Iterator[None]:
    """Hold the locks of several outputs (``tokenize``'s one prefix per ``--json-key``)."""
    with contextlib.ExitStack() as stack:
        for output in sorted({str(o) for o in outputs}):
            stack.enter_context(output_lock(output))
        yield
