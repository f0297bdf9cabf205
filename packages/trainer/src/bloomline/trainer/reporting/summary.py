"""The end-of-run summary: what the run did and what to run next, printed once by rank 0 and
written as ``RUN/summary.json`` when a run completes or stops to be continued (a failed run
writes none: its last lines are the error).

Losses come from ``metrics.jsonl`` (the whole run's, earlier sessions included) except the
final train loss, which the trainer hands over: the mean over the steps since the last log
line, as a log line would show it (the last train line's ``loss`` when the last step was
logged; a run stopped between log steps still has one).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.trainer.reporting.clock import format_hms
from bloomline.trainer.reporting.records import latest_per_step, read_records
from bloomline.trainer.train_state import TrainState

__all__ = ["SUMMARY_FILE", "RunEnd", "next_commands", "run_summary", "summary_lines",
           "write_summary"]

SUMMARY_FILE = "summary.json"
_PROMPT = "The"  # a prompt any tokenizer encodes; a person replaces it


@dataclass
class RunEnd:
    """How and where a run ended, as the trainer knows it.

    Args:
        run_dir: The run folder.
        state: The trainer's counters (``train_state.TrainState``).
        total_steps: Steps of the whole run.
        stop_reason: Why it stopped before ``total_steps``; "" when it completed.
        elapsed_s: Wall time of this process's run, start-up included.
        steps_here: Steps this process took.
        last_loss: (step, loss) of the last step taken, the loss as a log line would show
            it at that step (the mean since the last log line), or None.
        checkpoint: The newest checkpoint, or None.
        has_valid: Whether the run's data has a valid split (``trainer evaluate`` needs it).
        has_tokenizer: Whether the config names a tokenizer (``trainer generate`` needs it).
    """

    run_dir: Path
    state: TrainState
    total_steps: int
    stop_reason: str
    elapsed_s: float
    steps_here: int
    last_loss: tuple[int, float] | None
    checkpoint: Path | None
    has_valid: bool
    has_tokenizer: bool


def next_commands(end: RunEnd) -> list[str]:
    """The commands that use what the run made, as they run from where it was started."""
    run = shlex.quote(str(end.run_dir))
    commands = []
    if end.checkpoint is not None:
        ckpt = shlex.quote(str(end.checkpoint))
        if end.has_tokenizer:
            commands.append(f"trainer generate {ckpt} --prompt {shlex.quote(_PROMPT)}")
        if end.has_valid:
            commands.append(f"trainer evaluate {ckpt}")
        commands.append(f"trainer export-hf {ckpt} {shlex.quote(str(end.run_dir / 'hf'))}")
    commands.append(f"trainer plot {run}")
    return commands


def run_summary(end: RunEnd) -> dict:
    """The summary as ``summary.json`` holds it (losses None where the run has none)."""
    records = read_records(end.run_dir) if (end.run_dir / "metrics.jsonl").is_file() else []
    train = latest_per_step(records, "train")
    valid = [r for r in latest_per_step(records, "valid") if "valid_loss" in r]
    if end.last_loss is not None:
        train_step, train_loss = end.last_loss
    elif train:
        train_step, train_loss = train[-1]["step"], train[-1]["loss"]
    else:
        train_step = train_loss = None
    best = min(valid, key=lambda r: r["valid_loss"]) if valid else None
    state = end.state
    return {
        "status": "stopped" if end.stop_reason else "completed",
        "stop_reason": end.stop_reason or None,
        "wall_time_s": round(end.elapsed_s, 3),
        "steps": state.step, "total_steps": end.total_steps,
        "steps_this_session": end.steps_here,
        "samples": state.consumed_samples, "tokens": state.consumed_tokens,
        "final_train_loss": train_loss, "final_train_loss_step": train_step,
        "final_valid_loss": valid[-1]["valid_loss"] if valid else None,
        "final_valid_loss_step": valid[-1]["step"] if valid else None,
        "best_valid_loss": best["valid_loss"] if best else None,
        "best_valid_loss_step": best["step"] if best else None,
        "last_checkpoint": str(end.checkpoint) if end.checkpoint else None,
        "next_commands": next_commands(end),
    }


def summary_lines(summary: dict, path: Path) -> list[str]:
    """The console's summary: one line of what was done, one of losses, the checkpoint, the
    next commands (and, for a stopped run, how to continue it)."""
    stopped = summary["status"] == "stopped"
    head = (f"run {'stopped' if stopped else 'completed'}: step {summary['steps']} of "
            f"{summary['total_steps']}"
            + (f" ({summary['stop_reason']})" if stopped else "")
            + f", {summary['tokens']:,} tokens, wall time {format_hms(summary['wall_time_s'])}"
            f" ({summary['steps_this_session']} steps in this session)")
    losses = []
    if summary["final_train_loss"] is not None:
        losses.append(f"train loss {summary['final_train_loss']:.4f} "
                      f"(step {summary['final_train_loss_step']})")
    if summary["final_valid_loss"] is not None:
        losses.append(f"valid loss {summary['final_valid_loss']:.4f} "
                      f"(step {summary['final_valid_loss_step']})")
        losses.append(f"best valid loss {summary['best_valid_loss']:.4f} "
                      f"(step {summary['best_valid_loss_step']})")
    lines = [head]
    if losses:
        lines.append("  " + " | ".join(losses))
    lines.append(f"  last checkpoint: {summary['last_checkpoint'] or 'none'}")
    if stopped:
        lines.append("  to continue: the same trainer pretrain command with --resume auto")
    lines.append("  next:")
    lines.extend(f"    {command}" for command in summary["next_commands"])
    lines.append(f"  summary: {path}")
    return lines


def write_summary(run_dir: Path, summary: dict) -> Path:
    """``RUN/summary.json``, replaced whole (each session's end rewrites it)."""
    path = Path(run_dir) / SUMMARY_FILE
    atomic_write_bytes(path, (json.dumps(summary, indent=1) + "\n").encode())
    return path
