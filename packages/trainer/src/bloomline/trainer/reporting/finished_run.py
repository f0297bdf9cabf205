"""A run started where its checkpoint already is at the end this config asks for, or past it
(the run was continued with a larger ``train.train_samples``, then the first recipe run
again): nothing to train. One line says where the run stands against this config and what
to do (raise ``train.train_samples`` to go further, another ``train.run_dir`` to start
over), then the run's summary as a finished run prints it.

The exit code stays 0: what the command asks for, a run trained to this config's end, is
there, and a job that is requeued or re-run after it finished (SLURM, a script of
``--resume auto`` runs) must not fail; Megatron and torchtitan also end with 0 when the
loaded iteration is at or past their ``--train-iters`` / ``training.steps``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bloomline.trainer.checkpoint.layout import list_checkpoints
from bloomline.trainer.curriculum import global_batch_size
from bloomline.trainer.reporting.summary import SUMMARY_FILE, summary_lines

__all__ = ["finished_line", "nothing_left", "report_finished"]


def nothing_left(cfg, state, skips, data_parallel: int) -> bool:
    """Whether the run's next global batch would go past ``train.train_samples`` (the
    loop's own end), from the trainer's counters and the skips in force."""
    size = global_batch_size(cfg, state.consumed_samples, data_parallel)
    return skips.advance(state.consumed_samples, size) > cfg.train.train_samples


def finished_line(run_dir: Path, resumed: Path | None, state, total: int,
                  train_samples: int) -> str:
    """The one line: where the run stands against this config, and what to do."""
    where = resumed or run_dir
    restart = "to start over, use another train.run_dir"
    if state.step <= total:
        return (f"nothing to train: {where} is at step {state.step}, the end of this config's "
                f"{total} steps (train.train_samples {train_samples:,}); to train further, "
                f"raise train.train_samples; {restart}")
    return (f"nothing to train: {where} is at step {state.step} "
            f"({state.consumed_samples:,} samples), past this config's {total} steps "
            f"(train.train_samples {train_samples:,}): the run was continued further; to "
            f"train further, raise train.train_samples above {state.consumed_samples:,}; "
            f"{restart}")


def _summary_of(run_dir: Path, step: int) -> dict | None:
    """``RUN/summary.json`` as the run's end wrote it, when it is of ``step``."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("steps") == step else None


def report_finished(monitor, run_dir: Path, resumed: Path | None, state, total: int,
                    train_samples: int, has_valid: bool, log: Callable[[str], object]) -> None:
    """Rank 0: the line, then the run's summary: its ``summary.json`` of this step, printed
    again as it is (the session that finished it measured it), else a new one, of the run's
    own length."""
    log(finished_line(run_dir, resumed, state, total, train_samples))
    summary = _summary_of(run_dir, state.step)
    if summary is not None:
        try:
            lines = summary_lines(summary, run_dir / SUMMARY_FILE)
        except (KeyError, TypeError, ValueError):
            lines = []  # a summary of another version: written anew below
        for line in lines:
            log(line)
        if lines:
            return
    checkpoints = list_checkpoints(run_dir)
    monitor.summarize(state, max(total, state.step), "",
                      checkpoints[-1] if checkpoints else None, has_valid)
