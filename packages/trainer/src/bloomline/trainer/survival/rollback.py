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
import os
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.curriculum import global_batch_size
from bloomline.trainer.survival.sample_skips import SkipRanges
from bloomline.trainer.survival.spikes import SpikeFinding
from bloomline.trainer.train_state import range_problems

__all__ = ["ROLLBACKS_FILE", "Rollback", "append_rollback", "read_rollbacks", "skip_range",
           "skips_in_force"]

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
    """``{"skip_samples": [[start, end], ...], "events": [...]}`` of the run so far.

    Raises:
        UserError: The file is not a regular file, does not parse, or a field is not what
            ``append_rollback`` writes (skip ranges ``[start, end]`` with
            ``0 <= start < end``, events a list of objects): one line naming the entry.
    """
    path = Path(run_dir) / ROLLBACKS_FILE
    if not os.path.lexists(path):
        return {"skip_samples": [], "events": []}
    fix = ("fix the entry or remove the file (the checkpoints keep the skips they were "
           "saved with)")
    try:
        with open_regular(path, "rollback record") as fh:
            record = json.loads(fh.read())
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: does not parse ({err}); {fix}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}: holds {json.dumps(record)[:40]}, not an object with "
                        f"skip_samples and events; {fix}")
    problems = range_problems(record.get("skip_samples"), "skip_samples")
    events = record.get("events")
    if not (isinstance(events, list) and all(isinstance(e, dict) for e in events)):
        problems.append(f"events: {json.dumps(events)[:40]} is not a list of objects")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{path}: {problems[0]}{more}; {fix}")
    return record


def append_rollback(run_dir: str | Path, event: dict, skips: SkipRanges) -> None:
    """Add ``event`` and the skips now in force to ``RUN/rollbacks.json``."""
    record = read_rollbacks(run_dir)
    record["events"].append(event)
    record["skip_samples"] = skips.to_list()
    atomic_write_bytes(Path(run_dir) / ROLLBACKS_FILE,
                       (json.dumps(record, indent=1) + "\n").encode())


def skips_in_force(config_skips: list, saved_skips: list, run_dir: str | Path) -> SkipRanges:
    """The skips in force at a run's start: the config's, the checkpoint's (``saved_skips``),
    and those of rollbacks after the checkpoint was written (``RUN/rollbacks.json``)."""
    return SkipRanges([*config_skips, *saved_skips, *read_rollbacks(run_dir)["skip_samples"]])


class Rollback:
    """A run's rollbacks. ``checkpoints`` (the run's ``RunCheckpoints``) finds nothing itself:
    this picks the checkpoint (``checkpoint.latest_checkpoint``) and has ``checkpoints``
    load it; ``monitor`` gets the events (``monitor.write``); ``data_parallel`` sizes the
    steps whose samples are skipped."""

    def __init__(self, cfg, run_dir: Path, checkpoints, monitor, data_parallel: int,
                 is_main: bool, log) -> None:
        self.cfg, self.run_dir, self.checkpoints, self.monitor = cfg, run_dir, checkpoints, monitor
        self.data_parallel, self.is_main, self.log = data_parallel, is_main, log

    def __call__(self, finding: SpikeFinding, step: int, state, skips: SkipRanges):
        """Reload the newest good checkpoint before ``step`` and skip the batches around the
        spike: the ``Loaded`` state and skips to go on with (the new range added, the
        rollback counted). None when there is none (or rollbacks are off): the caller goes
        on as before rollbacks existed (a non-finite step is skipped, a finite spike kept).
        ``state``: the run's ``TrainState`` before the rollback (its rollback count)."""
        cfg, log = self.cfg, self.log
        event = {"kind": "rollback", "step": step, "reason": finding.reason,
                 "loss": finding.value if finding.reason != "grad-norm spike" else None,
                 "value": finding.value, "baseline": finding.baseline,
                 "threshold": finding.threshold}
        if not cfg.spike.enabled:
            return None
        self.checkpoints.finish()
        target = ckpt.latest_checkpoint(self.run_dir, before_step=step, log=log)
        if target is None:
            log(f"step {step}: {finding.describe()}; no checkpoint before it to roll back to")
            self.monitor.write({**event, "kind": "spike", "action": "none (no checkpoint)"})
            return None
        rollbacks = state.rollbacks + 1
        if rollbacks > cfg.spike.max_rollbacks:
            raise UserError(f"stopping at step {step}: {finding.describe()}, and the run "
                            f"has rolled back spike.max_rollbacks = {cfg.spike.max_rollbacks}"
                            f" times already; see {self.run_dir / ROLLBACKS_FILE}, lower "
                            "optimizer.lr or skip more data (train.skip_samples)")
        loaded = self.checkpoints.load(target, skips, verified=True)
        state, skips = loaded.state, loaded.skips
        start, end = skip_range(cfg, state.step, state.consumed_samples, step, skips,
                                self.data_parallel)
        skips.add(start, end)
        state.skip_samples = skips.to_list()
        state.rollbacks = rollbacks
        event.update(checkpoint=str(target), checkpoint_step=state.step,
                     skip=[start, end], rollbacks=rollbacks)
        if self.is_main:
            append_rollback(self.run_dir, event, skips)
        self.monitor.write(event)
        log(f"step {step}: {finding.describe()}; rolled back to {target.name} (step "
            f"{state.step}) and skipping train samples [{start}, {end}) "
            f"(rollback {rollbacks} of at most {cfg.spike.max_rollbacks})")
        return loaded
