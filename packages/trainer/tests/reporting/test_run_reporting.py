"""A run that explains itself: elapsed time and ETA on the console line, throughput without
the start-up, and the end-of-run summary (console and ``RUN/summary.json``). Times come from
a fake clock that only the steps advance: no sleeps, no dependence on the machine's speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_fixtures import FakeMeasure

import bloomline.trainer.reporting.monitor as monitor
from bloomline.common.errors import UserError
from bloomline.trainer.loop import Trainer
from bloomline.trainer.reporting import clock as run_clock
from bloomline.trainer.reporting.clock import RunClock, format_hms
from bloomline.trainer.reporting.summary import RunEnd, next_commands

TOKENS_PER_STEP = 4 * 32  # the tiny config: global batch 4 of 32 tokens


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _FakeClock()
    monkeypatch.setattr(run_clock, "_clock", fake)
    monkeypatch.setattr(monitor, "measure_peak_flops", FakeMeasure(1e15))
    return fake


def _trainer(cfg, clock, lines, first: float = 100.0, then: float = 1.0) -> Trainer:
    """A trainer whose first step takes ``first`` fake seconds (start-up) and every later one
    ``then``."""
    trainer = Trainer(cfg, log=lines.append)
    step = trainer.train_step

    def timed(*args, **kwargs):
        result = step(*args, **kwargs)
        clock.now += first if clock.now == 0 else then
        return result

    trainer.train_step = timed
    return trainer


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_hms_format():
    """Catches: an elapsed time or ETA not in h:mm:ss (minutes only, hours dropped), or an
    unknown ETA printed as a number."""
    assert format_hms(3725) == "1:02:05" and format_hms(65.4) == "0:01:05"
    assert format_hms(0) == "0:00:00" and format_hms(None) == "?"


def test_eta_is_the_recent_pace_without_the_first_step(clock):
    """Catches: an ETA that counts the first step's start-up in the pace (here 100x a step),
    or none at all while only one step was taken."""
    timer = RunClock(started=0.0)
    timer.steps_begin()
    assert timer.eta(10) is None
    clock.now = 100.0
    timer.step_ended()
    assert timer.eta(9) == pytest.approx(900.0)  # only the first step to go by
    for _ in range(3):
        clock.now += 2.0
        timer.step_ended()
    assert timer.seconds_per_step() == pytest.approx(2.0) and timer.eta(6) == pytest.approx(12)
    assert timer.elapsed() == pytest.approx(106.0)


@pytest.mark.slow
def test_throughput_and_eta_exclude_the_start_up(corpus, tmp_path, make_config, clock):
    """Catches: the first logged tokens/s (and MFU, and ETA) including the first step's
    start-up (its warm-up took 100x a step here: 2.5 tok/s instead of 128), or elapsed/ETA
    missing from the record and the console line. A first step that is also the first log
    step reports its own time (it is all there is)."""
    lines: list[str] = []
    run = tmp_path / "run"
    cfg = make_config(corpus, run, train={"train_samples": 40, "log_interval": 2})
    _trainer(cfg, clock, lines).run()
    start, first, second = _records(run, "train")[:3]
    # the process's first step is always logged, at its own pace: start-up included
    assert start["step"] == 1 and start["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP / 100)
    assert first["step"] == 2 and first["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP)
    assert second["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP)
    assert first["elapsed_s"] == pytest.approx(101) and first["eta_s"] == pytest.approx(8)
    assert any(line.startswith("step 2/10 |") and "| elapsed 0:01:41 | ETA 0:00:08" in line
               for line in lines), lines

    clock.now = 0.0
    alone = make_config(corpus, tmp_path / "alone", train={"train_samples": 8,
                                                           "log_interval": 1})
    _trainer(alone, clock, lines).run()
    first = _records(tmp_path / "alone", "train")[0]
    assert first["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP / 100)
    assert first["eta_s"] == pytest.approx(100)


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow
def test_summary_of_a_completed_run(corpus, tmp_path, make_config, clock):
    """Catches: a run that ends without saying what it did (steps, tokens, time, losses,
    best validation and its step, the checkpoint) and what to run next, or a summary.json
    that disagrees with metrics.jsonl."""
    lines: list[str] = []
    run = tmp_path / "run"
    cfg = make_config(corpus, run, train={"train_samples": 40, "log_interval": 2,
                                          "eval_interval": 4, "eval_samples": 4})
    _trainer(cfg, clock, lines).run()
    summary = _summary(run)
    train, valid = _records(run, "train"), _records(run, "valid")
    best = min(valid, key=lambda r: r["valid_loss"])
    checkpoint = run / "checkpoints" / "step_00000010"
    assert summary == {
        "status": "completed", "stop_reason": None, "wall_time_s": pytest.approx(109),
        "steps": 10, "total_steps": 10, "steps_this_session": 10, "samples": 40,
        "tokens": 10 * TOKENS_PER_STEP,
        "final_train_loss": train[-1]["loss"], "final_train_loss_step": 10,
        "final_valid_loss": valid[-1]["valid_loss"], "final_valid_loss_step": 10,
        "best_valid_loss": best["valid_loss"], "best_valid_loss_step": best["step"],
        "last_checkpoint": str(checkpoint),
        "next_commands": [f"trainer evaluate {checkpoint}",
                          f"trainer export-hf {checkpoint} {run / 'hf'}", f"trainer plot {run}"]}
    start = lines.index(next(line for line in lines if line.startswith("run completed")))
    assert lines[start:] == [
        "run completed: step 10 of 10, 1,280 tokens, wall time 0:01:49 (10 steps in this "
        "session)",
        f"  train loss {train[-1]['loss']:.4f} (step 10) | valid loss "
        f"{valid[-1]['valid_loss']:.4f} (step 10) | best valid loss {best['valid_loss']:.4f} "
        f"(step {best['step']})",
        f"  last checkpoint: {checkpoint}",
        "  next:",
        f"    trainer evaluate {checkpoint}",
        f"    trainer export-hf {checkpoint} {run / 'hf'}",
        f"    trainer plot {run}",
        f"  summary: {run / 'summary.json'}"]


@pytest.mark.slow
def test_summary_of_stopped_and_resumed_runs(corpus, tmp_path, make_config, clock):
    """Catches: a stop (train.exit_interval, train.max_wallclock: the preemption path, exit
    75) reported as a completed run or without how to continue; a resumed session's summary
    that forgets the earlier sessions' validation (best valid loss) or counts their steps as
    its own."""
    lines: list[str] = []
    run = tmp_path / "run"
    cfg = make_config(corpus, run, train={"train_samples": 40, "log_interval": 2,
                                          "eval_interval": 2, "eval_samples": 4,
                                          "exit_interval": 4})
    _trainer(cfg, clock, lines).run()
    first = _summary(run)
    assert (first["status"], first["steps"], first["stop_reason"]) == (
        "stopped", 4, "train.exit_interval = 4 steps in this process")
    assert "run stopped: step 4 of 10 (train.exit_interval = 4 steps in this process)" \
        in "\n".join(lines)
    assert "  to continue: the same trainer pretrain command with --resume auto" in lines
    valid_before = {r["step"]: r["valid_loss"] for r in _records(run, "valid")}

    cfg.train.exit_interval = 0
    cfg.train.max_wallclock = 1e-6  # used up at once: stops after one step, as preempted
    state = _trainer(cfg, clock, lines).run()
    stopped = _summary(run)
    assert "train.max_wallclock" in state.stopped
    assert (stopped["status"], stopped["steps"], stopped["steps_this_session"]) == (
        "stopped", 5, 1)
    assert stopped["stop_reason"] == state.stopped
    assert stopped["last_checkpoint"] == str(run / "checkpoints" / "step_00000005")

    cfg.train.max_wallclock = 0
    _trainer(cfg, clock, lines).run()
    done = _summary(run)
    valid = {r["step"]: r["valid_loss"] for r in _records(run, "valid")}
    assert set(valid_before) <= set(valid) and done["steps_this_session"] == 5
    assert (done["status"], done["best_valid_loss"]) == ("completed", min(valid.values()))


def test_a_failed_run_prints_and_writes_no_summary(corpus, tmp_path, make_config, clock):
    """Catches: a summary (or "run completed") printed by a run that failed: its last line
    must stay the error."""
    lines: list[str] = []
    cfg = make_config(corpus, tmp_path / "run", train={"max_bad_steps": 1})
    trainer = _trainer(cfg, clock, lines)
    with torch.no_grad():
        trainer.model.ln_f.weight.fill_(float("nan"))
    with pytest.raises(UserError, match="consecutive steps with a non-finite loss"):
        trainer.run()
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not any(line.startswith("run ") for line in lines)


def test_next_commands_need_what_they_use(tmp_path):
    """Catches: a suggested command that cannot run as printed: generate without a
    tokenizer, evaluate without a valid split, paths with spaces unquoted."""
    run = tmp_path / "my run"
    ckpt = run / "checkpoints" / "step_00000003"
    end = RunEnd(run, {}, 3, "", 1.0, 3, None, ckpt, has_valid=True, has_tokenizer=True)
    assert next_commands(end) == [
        f"trainer generate '{ckpt}' --prompt The", f"trainer evaluate '{ckpt}'",
        f"trainer export-hf '{ckpt}' '{run / 'hf'}'", f"trainer plot '{run}'"]
    bare = RunEnd(run, {}, 3, "", 1.0, 3, None, None, has_valid=False, has_tokenizer=False)
    assert next_commands(bare) == [f"trainer plot '{run}'"]
