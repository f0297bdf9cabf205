"""What a run folder guarantees: one trainer at a time, and nothing in it lost.

One trainer at a time: ``RUN/.lock``, an exclusive ``flock`` that global rank 0 takes before
the run touches the folder and holds for the run's life (``RunLock``; ``RunGuard`` takes and
releases it). A second trainer on the same folder (a resubmitted job while the first still
runs, a typo in ``train.run_dir``) would write the same checkpoint folders, prune the other's
checkpoints and interleave its records into ``metrics.jsonl``; it is refused with one line
naming the holder, on every rank (rank 0's answer is broadcast). The kernel drops the lock
when the holder dies however it dies, so a ``kill -9``'d run does not block its own restart;
the file stays (removing it would let two processes lock two different files).

Nothing lost: ``check_start_point``, once the run knows where it starts. A run that would
start over a folder of checkpoints it did not resume from is refused:

- ``checkpoint.resume = auto`` and none of the run's checkpoints verifies: training from step
  0 would replace them at its first saves and retention would delete the rest;
- ``checkpoint.resume = none`` in a folder that holds checkpoints: the same;
- ``checkpoint.resume = PATH`` older than checkpoints the folder holds: the run would write
  its own, different, checkpoints of those steps over them;
- any setting, when the folder holds checkpoints of the format before manifests (bloomline
  until 2026-11-25; no verified checkpoint sees them) of later steps than the one resumed:
  the same (``trainer upgrade-checkpoint`` converts one, ``checkpoint/legacy.py``).

(``auto`` falling back past damaged checkpoints to an older good one is not refused: it trains
those steps again, and its save of a damaged one's step replaces it.)

The way out is explicit: a fresh ``train.run_dir`` (or the checkpoints moved away by hand).

Usable from anywhere: ``write_run_tokenizer`` keeps the run's tokenizer files in
``RUN/tokenizer/`` (``checkpoint/tokenizer_copy.py``), and the config saved in the folder holds
absolute paths (``config.load_trainer_config``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.layout import legacy_checkpoints, list_checkpoints
from bloomline.trainer.checkpoint.tokenizer_copy import TOKENIZER_DIR

__all__ = ["LOCK_FILE", "RunLock", "check_start_point", "close_inherited_locks",
           "write_run_tokenizer"]

LOCK_FILE = ".lock"
# descriptors of the locks this process holds: a forked child (a loader worker) closes its
# copies, which would otherwise keep the lock held for as long as the child lives
_HELD: set[int] = set()
# file systems without flock support (Lustre mounted without -o flock, some FUSE mounts)
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def close_inherited_locks() -> None:
    """In a forked child: close the copies of this process's lock descriptors (the lock stays
    with the parent: it is released only by LOCK_UN or when every copy is closed)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class RunLock:
    """``RUN/.lock``, held by global rank 0 (``is_holder``) between ``acquire`` and
    ``release``. ``acquire`` is collective when the process group is up."""

    def __init__(self, run_dir: str | Path, is_holder: bool) -> None:
        self.run_dir = Path(run_dir)
        self.is_holder = is_holder
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_FILE

    def acquire(self) -> None:
        """Take the lock (rank 0), and tell every rank whether it did.

        Raises:
            UserError: Another process holds it (on every rank, with the same line).
        """
        problem = ""
        if self.is_holder:
            try:
                problem = self._take()
            except OSError as err:  # the folder cannot be made or opened: every rank says so
                problem = f"{err.filename or self.path}: {err.strerror or err}"
        if _distributed():
            import torch.distributed as dist

            box = [problem]
            dist.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem:
            raise UserError(problem)

    def _take(self) -> str:
        """'' once locked (or where the file system has no locks), else the refusal."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            return (f"train.run_dir {self.run_dir}: in use by another trainer{holder}; two "
                    "trainers in one run folder overwrite each other's checkpoints and "
                    "metrics: wait for it to end or stop it, or give this run another "
                    "train.run_dir")
        except OSError as err:
            os.close(fd)
            if err.errno not in _UNSUPPORTED:
                raise
            print(f"warning: {self.path}: this file system does not support file locks "
                  f"({err.strerror}); nothing stops a second trainer on this run folder",
                  file=sys.stderr, flush=True)
            return ""
        # who holds it, for the refusal of the next one (the lock, not the text, is the guard)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                "job": os.environ.get("SLURM_JOB_ID", "")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        _HELD.add(fd)
        return ""

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.discard(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    """' (pid P on HOST since T)' from the lock file, or '' when it cannot be read."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        where = f"pid {int(info['pid'])} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    job = info.get("job")
    return f" ({where}{f', SLURM job {job}' if job else ''})"


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name[5:])


def check_start_point(run_dir: str | Path, setting: str, resumed: Path | None,
                      resumed_step: int) -> None:
    """Refuse a start that would lose the run folder's checkpoints (see the module docstring).
    Call it once ``checkpoint.resume`` has been applied: ``resumed`` is the checkpoint the run
    continues (None: it starts at step 0) and ``resumed_step`` its step. The same on every
    rank (every rank lists the same folder).

    Raises:
        UserError: Naming the checkpoints and the way to start over.
    """
    fresh = ("start the new run in a fresh train.run_dir (or move "
             f"{Path(run_dir) / 'checkpoints'} away)")
    # checkpoints of the format before manifests: invisible to list_checkpoints, and a save of
    # the same step would replace one (checkpoint/legacy.py)
    old = [path for path in legacy_checkpoints(run_dir)
           if resumed is None or _step_of(path) > resumed_step]
    if old:
        raise UserError(f"checkpoint.resume {setting}: {run_dir} holds checkpoints of the "
                        f"format before manifests ({', '.join(p.name for p in old)}), which "
                        "this run would replace; `trainer upgrade-checkpoint "
                        f"{old[-1]} NEW` converts the newest, then resume it with "
                        f"checkpoint.resume=NEW; or {fresh}")
    if resumed is not None and setting == "auto":
        # newer ones are damaged (the fallback skipped them): a save of the same step, once
        # the run gets there again, replaces each (its steps are trained again, none lost)
        return
    found = list_checkpoints(run_dir)
    if resumed is not None:
        found = [path for path in found if _step_of(path) > resumed_step]
    if not found:
        return
    names = ", ".join(path.name for path in found)
    if resumed is not None:
        raise UserError(f"checkpoint.resume {setting}: {run_dir} holds checkpoints after its "
                        f"step {resumed_step} ({names}), which this run would replace with "
                        f"its own; resume the newest with --resume auto, or {fresh}")
    if setting == "auto":
        raise UserError(f"checkpoint.resume auto: none of the {len(found)} checkpoints of "
                        f"{run_dir} verifies ({names}; the lines above say why), and a run "
                        "from step 0 would replace them; nothing was deleted: check them with "
                        f"`trainer verify-checkpoint PATH`, or {fresh}")
    raise UserError(f"checkpoint.resume {setting}: {run_dir} holds checkpoints ({names}), "
                    f"which a new run would replace and prune; continue them with --resume "
                    f"auto, or {fresh}")


def write_run_tokenizer(run_dir: str | Path, files: dict[str, bytes]) -> None:
    """``RUN/tokenizer/`` holding exactly ``files`` (``tokenizer_copy_files``: names under
    ``tokenizer/``), each written atomically; files of an earlier tokenizer of the folder are
    removed, so that the copy never mixes two tokenizers. Rank 0, once the run holds the
    folder's lock."""
    folder = Path(run_dir) / TOKENIZER_DIR
    wanted = {Path(name).name for name in files}
    if folder.is_dir():
        for old in folder.iterdir():
            if old.is_file() and old.name not in wanted:
                old.unlink()
    for name, data in files.items():
        atomic_write_bytes(Path(run_dir) / name, data)
