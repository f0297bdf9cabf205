"""A checkpoint save that fails leaves nothing behind and says why in one line.

A save can fail half-way: the disk or the quota fills up, a write gets an I/O error, Ctrl-C
lands during it. What it wrote so far is in its hidden ``.step_N.partial`` folder, which no
reader takes for a checkpoint; ``failed_save`` removes it there and then (rank 0, which made
it), instead of leaving it for the next save, and leaves the complete checkpoints alone: the
run resumes from the newest of them.

The error of a full disk reaches the trainer in several shapes: an ``OSError`` (often without
a file name: a ``write`` that fails names no file) from our own files, or DCP's
``CheckpointException`` (a ``BaseException``) that carries each rank's exception. Any of them
holding an ``OSError`` becomes one ``UserError`` line naming the folder, the error and what to
do; so does torch's zip writer's short-write ``RuntimeError`` ("unexpected pos") when the
folder's file system is full at that moment; anything else (a bug) keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from bloomline.common.errors import UserError
from bloomline.common.machine import free_disk
from bloomline.trainer.checkpoint.layout import PendingSave, list_checkpoints

__all__ = ["failed_save", "os_error_in"]


def _chain(exc: BaseException):
    """``exc``, the exceptions it was raised from, and the per-rank exceptions of a DCP
    ``CheckpointException`` (not the exceptions it was raised while handling: a bug in an
    ``except OSError`` block stays a bug)."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)  # CheckpointException: {rank: (exc, tb)}
        if isinstance(failures, dict):
            todo += [pair[0] for pair in failures.values()
                     if isinstance(pair, tuple) and pair and isinstance(pair[0], BaseException)]
        todo.append(current.__cause__)


def os_error_in(exc: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``exc``'s chain (``_chain``); None when there
    is none."""
    return next((e for e in _chain(exc) if isinstance(e, OSError) and e.errno is not None),
                None)


def _message(pending: PendingSave, error: OSError) -> str:
    what = error.strerror or str(error)
    where = f"{error.filename}" if error.filename else f"{pending.partial}"
    kept = list_checkpoints(pending.root.parent)
    newest = (f"; the newest complete checkpoint, {kept[-1].name}, is intact" if kept
              else "; there is no complete checkpoint yet")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = (f"free space in {pending.root} (or lower checkpoint.keep_last), then resume "
                  "with --resume auto")
    else:
        advice = "fix that, then resume with --resume auto"
    return (f"checkpoint of step {pending.step}: cannot write {where}: {what}; the unfinished "
            f"checkpoint was removed{newest}; {advice}")


@contextlib.contextmanager
def failed_save(pending: PendingSave) -> Iterator[None]:
    """Around the writing of ``pending``: on any failure (interrupts included) remove its
    partial folder (on the writer), and turn a failure holding an ``OSError`` into a
    ``UserError``; other exceptions and interrupts go on as they are."""
    try:
        yield
    except BaseException as err:
        # read before the partial folder goes (its removal frees the space)
        full = os_error_in(err) is None and _short_write(err) and _disk_full(pending)
        if pending.is_writer:
            shutil.rmtree(pending.partial, ignore_errors=True)
        if isinstance(err, (KeyboardInterrupt, SystemExit, UserError)):
            raise
        error = os_error_in(err) or (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                                     if full else None)
        if error is None:
            raise
        raise UserError(_message(pending, error)) from err


# torch's zip writer (``torch.save``, which DCP uses for non-tensor entries) does not raise
# the OSError of a write that fell short: it notices later that the file is not where it
# wrote to, and says so in a RuntimeError
_SHORT_WRITE = ("unexpected pos", "failed writing file")


def _short_write(exc: BaseException) -> bool:
    """Whether torch's writer's short-write error is in ``exc``'s chain (``_chain``)."""
    return any(isinstance(e, RuntimeError) and any(text in str(e) for text in _SHORT_WRITE)
               for e in _chain(exc))


def _disk_full(pending: PendingSave) -> bool:
    """Whether the partial folder's file system has (next to) nothing left: a short write
    there was the disk filling up, not a bug."""
    free = free_disk(pending.partial)
    return free is not None and free < _NEARLY_FULL


_NEARLY_FULL = 1 << 20  # bytes free below which a short write is taken for a full disk
