"""Rolling back from a loss spike: which samples to skip, and the run's record of it.

PaLM's recipe for a spike was manual: restart from a checkpoint ~100 steps before it and skip
the 200-500 batches around it. Here it is automatic. The run reloads the newest good checkpoint
older than the spike and skips the batches of steps ``spike - spike.skip_before`` (not before
the checkpoint: those are in its weights) to ``spike + spike.skip_after``, as one range of
sample positions (``sample_skips.py``). The positions of those steps are recomputed from the
checkpoint's ``consumed_samples``: the order is a pure function of the position, the batch
size schedule and the skips already in force, so nothing per step needs recording.

Every rollback is appended to ``RUN/rollbacks.json`` (written atomically by rank 0) as well as
to ``metrics.jsonl``: the skips must survive a crash right after the rollback, before the next
checkpoint stores them in its trainer state, or the resumed run would meet the spike again.
"""

from __future__ import annotations

import json
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.trainer.curriculum import global_batch_size
from bloomline.trainer.survival.sample_skips import SkipRanges

__all__ = ["ROLLBACKS_FILE", "skip_range", "read_rollbacks", "append_rollback"]

ROLLBACKS_FILE = "rollbacks.json"


def skip_range(cfg, checkpoint_step: int, checkpoint_position: int, spike_step: int,
               skips: SkipRanges, data_parallel: int) -> tuple[int, int]:
    """The ``[start, end)`` sample positions to skip for a spike at ``spike_step`` after
    rolling back to the checkpoint of ``checkpoint_step`` (whose position is
    ``checkpoint_position``)."""
    first = max(checkpoint_step + 1, spike_step - cfg.spike.skip_before)
    last = spike_step + cfg.spike.skip_after
    position, start = checkpoint_position, checkpoint_position
    for step in range(checkpoint_step + 1, last + 1):
        if step == first:
            start = position
        size = global_batch_size(cfg, position, data_parallel)
        position = skips.advance(position, size)
        if position >= cfg.train.train_samples:
            return start, cfg.train.train_samples
    return start, position


def read_rollbacks(run_dir: str | Path) -> dict:
    """``{"skip_samples": [[start, end], ...], "events": [...]}`` of the run so far."""
    path = Path(run_dir) / ROLLBACKS_FILE
    if not path.is_file():
        return {"skip_samples": [], "events": []}
    return json.loads(path.read_text())


def append_rollback(run_dir: str | Path, event: dict, skips: SkipRanges) -> None:
    """Add ``event`` and the skips now in force to ``RUN/rollbacks.json``."""
    record = read_rollbacks(run_dir)
    record["events"].append(event)
    record["skip_samples"] = skips.to_list()
    atomic_write_bytes(Path(run_dir) / ROLLBACKS_FILE,
                       (json.dumps(record, indent=1) + "\n").encode())
