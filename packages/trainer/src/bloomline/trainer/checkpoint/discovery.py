"""Which checkpoint of a run to use: the newest that verifies (``latest_checkpoint``).

Apart from the save and the load because it is neither: it lists and verifies folders, and
every rank must walk the same candidates in the same order to agree on the answer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

from bloomline.trainer.checkpoint.layout import list_checkpoints
from bloomline.trainer.checkpoint.manifest import verify_checkpoint

__all__ = ["latest_checkpoint"]


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _log_on_first_rank(line: str) -> None:
    if not _distributed() or torch.distributed.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def latest_checkpoint(run_dir: str | Path, before_step: int | None = None,
                      log: Callable[[str], object] | None = None, group=None) -> Path | None:
    """The newest checkpoint of a run that verifies, or None.

    Each newer one that does not verify is logged once with its first problem and skipped.
    Collective when the process group is up (verification shares the hashing): all ranks
    call it and get the same answer.

    Args:
        run_dir: The run folder (``train.run_dir``).
        before_step: Only consider checkpoints of steps below this one.
        log: Where the fallback lines go; None: stderr on the first rank.
        group: Process group for the collectives (None: the default group).

    Returns:
        The checkpoint folder, or None when no checkpoint verifies.
    """
    candidates = [p for p in list_checkpoints(run_dir)
                  if before_step is None or int(p.name[5:]) < before_step]
    if _distributed():  # every rank must verify the same folders, in the same order
        box = [candidates]
        torch.distributed.broadcast_object_list(
            box, src=torch.distributed.get_global_rank(group, 0) if group else 0, group=group)
        candidates = box[0]
    for index, path in reversed(list(enumerate(candidates))):
        problems = verify_checkpoint(path, group)
        if not problems:
            return path
        then = "falling back to the previous one" if index else "no older checkpoint"
        (log or _log_on_first_rank)(f"checkpoint {path}: damaged ({problems[0]}); {then}")
    return None
