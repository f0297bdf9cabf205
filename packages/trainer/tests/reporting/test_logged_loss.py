"""The loss a log line reports is the mean over the log interval (Megatron's meaning), skipped
steps left out, in the console line, metrics.jsonl and the summary alike; the spike detector
still judges each step's own loss; and the start-up says what it is doing before the first
step's line, which is always printed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from trainer_fixtures import FakeMeasure

import bloomline.trainer.reporting.monitor as monitor
from bloomline.trainer.loop import Trainer
from bloomline.trainer.reporting.loss_interval import LossInterval

NAN_STEP = 3  # its loss is NaN: the step is skipped


def test_interval_mean_leaves_out_skipped_steps():
    """Bug: a skipped step's NaN summed into the mean (every line after it NaN), the mean
    divided by the steps including skipped ones, or an interval of skipped steps only logged
    as 0 (Megatron prints nothing; here the step's own non-finite loss is the news)."""
    interval = LossInterval()
    for loss, skipped in ((2.0, False), (math.nan, True), (4.0, False)):
        interval.add(loss, skipped)
    assert interval.record(9.9) == {"loss": 3.0, "loss_last": 4.0, "loss_steps": 2}
    only_skipped = LossInterval()
    only_skipped.add(math.inf, True)
    assert only_skipped.mean() == math.inf
    assert LossInterval().record(5.0)["loss"] == 5.0  # a record made outside the loop


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """12 steps logged every 5, step 3 non-finite (its weights NaN for that step only), the
    peak measured (faked) and the indices built in a cache of their own: the per-step losses
    the step returned, those the spike detector judged, the console lines, the records."""
    from trainer_fixtures import tiny_config, write_corpus

    tmp = tmp_path_factory.mktemp("logged")
    corpus = write_corpus(tmp / "corpus")
    run = tmp / "run"
    cfg = tiny_config(corpus, run, train={"train_samples": 48, "log_interval": 5},
                      data={"cache_dir": str(tmp / "index-cache")}, monitor={"peak_flops": 0.0})
    lines: list[str] = []
    trainer = Trainer(cfg, log=lines.append)
    steps: dict[int, float] = {}
    judged: list[float] = []
    step, judge = trainer.train_step, trainer.guard.judge

    def train_step(*args, **kwargs):
        number = len(steps) + 1
        weight = trainer.model.ln_f.weight
        kept = weight.detach().clone()
        if number == NAN_STEP:
            with torch.no_grad():
                weight.fill_(math.nan)
        lines.append(f"<step {number} runs>")
        result = step(*args, **kwargs)
        with torch.no_grad():
            weight.copy_(kept)
        steps[number] = result["loss"]
        return result

    def spy(result):
        judged.append(result["loss"])
        return judge(result)

    trainer.train_step, trainer.guard.judge = train_step, spy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(monitor, "measure_peak_flops", FakeMeasure(1e15))
        trainer.run()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"steps": steps, "judged": judged, "lines": lines,
            "train": [r for r in records if r["kind"] == "train"],
            "summary": json.loads((run / "summary.json").read_text())}


def _mean(losses: dict[int, float], first: int, last: int) -> float:
    kept = [losses[s] for s in range(first, last + 1) if s != NAN_STEP]
    return sum(kept) / len(kept)


@pytest.mark.slow
def test_logged_loss_is_the_interval_mean_without_skipped_steps(logged_run):
    """Bug: the logged ``loss`` is the log step's own loss (a noisy curve: 3.16 -> 4.42 ->
    3.24 -> 3.87), a skipped step's NaN is averaged in, the console shows another number than
    metrics.jsonl, ``loss_last`` is not the step's own, the summary's train loss is not the
    last line's, or the spike detector is fed the mean instead of each step's loss."""
    losses, train = logged_run["steps"], logged_run["train"]
    assert math.isnan(losses[NAN_STEP]) and len(losses) == 12
    assert [r["step"] for r in train] == [1, 5, 10, 12]
    for record, (first, last) in zip(train, [(1, 1), (2, 5), (6, 10), (11, 12)], strict=True):
        assert record["loss"] == pytest.approx(_mean(losses, first, last), rel=1e-12)
        assert record["loss_last"] == losses[last]
        assert record["loss_steps"] == sum(s != NAN_STEP for s in range(first, last + 1))
        line = next(x for x in logged_run["lines"] if x.startswith(f"step {last}/12 |"))
        assert f"| loss {record['loss']:.4f} |" in line, line
    assert train[1]["loss"] != pytest.approx(losses[5], rel=1e-6)  # not the step's own
    assert logged_run["judged"][:NAN_STEP - 1] == [losses[1], losses[2]]
    assert [x for x in logged_run["judged"] if not math.isnan(x)] == [
        v for v in losses.values() if not math.isnan(v)]
    summary = logged_run["summary"]
    assert (summary["final_train_loss"], summary["final_train_loss_step"]) == (
        train[-1]["loss"], 12)


@pytest.mark.slow
def test_start_up_says_what_it_does_before_the_first_step_line(logged_run):
    """Bug: silence from the start until the first log interval (minutes under load): the
    phases (building the model, the indices with their time, measuring the peak, the first
    step) must be said as they begin, on rank 0, before step 1's line, which is printed
    although step 1 is not a multiple of train.log_interval."""
    lines = logged_run["lines"]
    first_step_runs = lines.index("<step 1 runs>")
    start = [x for x in lines[:first_step_runs] if x.startswith("start ")]
    assert [x.split(" | ", 1)[1].split(":")[0] for x in start] == [
        "building the model", "data", "data", "measuring the matmul peak for MFU (a few "
        "seconds; monitor.peak_flops skips it)", "first step"], start
    assert all(x[len("start "):].split(" | ")[0].count(":") == 2 for x in start)  # h:mm:ss
    assert "sample indices built, 0 reused, in" in start[2]
    first_line = next(i for i, x in enumerate(lines) if x.startswith("step 1/12 |"))
    assert first_step_runs < first_line < lines.index("<step 2 runs>")
    assert not any(x.startswith("start ") for x in lines[first_step_runs:])
