"""The seams the training loop is built from, checked without a run: the step's shared tail
(``step/tail.py``), the console line (``reporting/monitor.py``), the batches with the spike fault
behind them (``data.StepBatches``) and the bad-step count (``survival/run_guard.py``)."""

from __future__ import annotations

import pytest
import torch

from bloomline.common.errors import UserError
from bloomline.trainer.config import Config
from bloomline.trainer.data import MegatronSampler, StepBatches
from bloomline.trainer.reporting.monitor import console_line
from bloomline.trainer.step.tail import dp_mean, dp_sum, finish_step
from bloomline.trainer.survival.run_guard import RunGuard
from bloomline.trainer.train_state import TrainState


class _Optimizer:
    """Records the calls of the step's tail, and whether gradients were there at the step."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.param, self.calls = param, []

    def step(self) -> None:
        self.calls.append("step")

    def zero_grad(self, set_to_none: bool) -> None:
        self.calls.append(f"zero_grad({set_to_none})")
        self.param.grad = None


def _param_with_grad() -> torch.nn.Parameter:
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    return param


def test_finish_step_steps_finite_steps_and_reads_stats_before_the_gradients_go():
    """Catches: a twin tail drifting from the other (another key, another order), activation
    stats read after ``zero_grad`` (their per-layer gradient norms all 0), or the optimizer
    not stepping a finite step."""
    param = _param_with_grad()
    optimizer = _Optimizer(param)
    result = finish_step(optimizer, None, torch.tensor(2.5), torch.tensor(0.5),
                         torch.tensor([[5.0, 2.5], [2.0, 1.0]], dtype=torch.float64),
                         lambda: {"grad_norm": [float(param.grad.norm())]})
    assert result == {"loss": 2.5, "grad_norm": 0.5, "skipped": False,
                      "source_totals": [[5.0, 2.5], [2.0, 1.0]],
                      "activation_stats": {"grad_norm": [pytest.approx(2 ** 0.5)]}}
    assert optimizer.calls == ["step", "zero_grad(True)"] and param.grad is None


@pytest.mark.parametrize("loss, norm", [(float("nan"), 1.0), (1.0, float("inf"))])
def test_finish_step_skips_a_non_finite_step_but_drops_its_gradients(loss, norm):
    """Catches: a NaN loss or an inf gradient norm applied to the weights, or its gradients
    left to leak into the next step's accumulation."""
    optimizer = _Optimizer(_param_with_grad())
    result = finish_step(optimizer, None, torch.tensor(loss), torch.tensor(norm))
    assert result["skipped"] and "source_totals" not in result
    assert optimizer.calls == ["zero_grad(True)"]


def test_dp_helpers_are_the_value_itself_without_data_parallelism():
    """Catches: a reduction attempted without a process group (one process, dp 1)."""
    value = torch.tensor([1.0, 2.0])
    assert dp_sum(value, None) is value and dp_mean(value, None) is value


def test_console_line_keeps_its_format():
    """Catches: a change to the console line that log readers and the README's examples
    rely on (field order, decimals, the optional parts, elapsed and ETA in h:mm:ss, an
    unknown ETA)."""
    record = {"step": 5, "loss": 7.123456, "lr": 2.666e-4, "grad_norm": 1.5234,
              "tokens_per_s": 1234.5, "mfu": 0.1331, "seq_length": 256,
              "global_batch_size": 16, "memory_gb": 0.678, "loss_scale": None,
              "skipped_steps": 2, "train_loss/en": 7.0, "train_loss/code": 7.25,
              "elapsed_s": 62.4, "eta_s": 3725.0}
    assert console_line(record, 60) == (
        "step 5/60 | loss 7.1235 | lr 2.67e-04 | gnorm 1.523 | 1,234 tok/s | mfu 13.3% | "
        "seq 256 | gbs 16 | mem 0.68 GB | elapsed 0:01:02 | ETA 1:02:05 | skipped 2 | "
        "en 7.00 · code 7.25")
    record["eta_s"] = None
    assert "| elapsed 0:01:02 | ETA ? |" in console_line(record, 60)


def _step_batches(monkeypatch, faults: str | None) -> StepBatches:
    if faults is None:
        monkeypatch.delenv("BLOOMLINE_FAULTS", raising=False)
    else:
        monkeypatch.setenv("BLOOMLINE_FAULTS", faults)
    sampler = MegatronSampler(16, 0, 2)
    loader = [torch.arange(i * 10, i * 10 + 2 * 5).view(2, 5) for i in range(8)]
    return StepBatches(sampler, loader, with_ids=False, vocab_size=100)


def test_step_batches_hand_out_ids_and_corrupt_only_the_spiked_micro_batch(monkeypatch):
    """Catches: the spike fault's corruption moved out of the loop but no longer applied
    (the spike tests would then see no spike), applied to the wrong micro-batch, or batches
    not cut to the step's sequence length."""
    batches = _step_batches(monkeypatch, "spike@batch:sample=2")
    micro, ids = batches.next_step(2, 3)
    assert ids == [[0, 1], [2, 3]]
    assert micro[0].tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert set(micro[1].unique().tolist()) == {98, 99} and micro[1].shape == (2, 4)


def test_step_batches_without_faults_or_blend_read_no_ids(monkeypatch):
    """Catches: the main process walking the sampler a second time when nothing needs ids."""
    micro, ids = _step_batches(monkeypatch, None).next_step(1, 4)
    assert ids is None and micro[0].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_bad_steps_count_and_stop_and_fp16_overflows_are_not_bad(tmp_path):
    """Catches: an fp16 overflow (finite loss, scaler backing off) counted towards
    ``train.max_bad_steps``, a good step not ending a streak, the limit not read from the
    config, or no stop after too many."""
    cfg = Config()
    cfg.train.max_bad_steps = 1
    guard = RunGuard(cfg, tmp_path, rank=0)  # not started: no lock, signals or timer
    state, lines = TrainState(), []
    bad = {"skipped": True, "loss": float("nan"), "grad_norm": 1.0}
    overflow = {"skipped": True, "loss": 3.0, "grad_norm": float("inf")}
    guard.count_bad(state, overflow, 1, True, lines.append)
    assert (state.skipped_steps, state.bad_in_row) == (1, 0) and not lines
    guard.count_bad(state, bad, 2, False, lines.append)
    guard.count_bad(state, {"skipped": False}, 3, False, lines.append)
    assert (state.skipped_steps, state.bad_in_row) == (2, 0) and len(lines) == 1
    guard.count_bad(state, bad, 4, False, lines.append)
    with pytest.raises(UserError, match="train.max_bad_steps = 1"):
        guard.count_bad(state, bad, 5, False, lines.append)
