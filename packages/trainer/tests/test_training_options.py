"""Options the recipe exposes that the other tests do not exercise: LAMB's update, fp16 loss
scaling, profiler traces, DataLoader workers."""

from __future__ import annotations

import json

import pytest
import torch

from bloomline.common.errors import UserError
from bloomline.trainer.kernels.cpu import linear
from bloomline.trainer.loop import Trainer
from bloomline.trainer.optim import Lamb


def _records(run_dir, kind="train"):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_lamb_step_is_adam_scaled_by_the_trust_ratio():
    """Bug: LAMB without bias correction, with weight decay outside the trust ratio, or with
    the ratio inverted. One step by hand: w = [3, 4], g = [1, -2], betas (0.9, 0.99), eps 0,
    decay 0.1: the bias-corrected Adam direction is sign(g) = [1, -1]; the update adds 0.1 w;
    trust = ||w|| / ||update||."""
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    w.grad = torch.tensor([1.0, -2.0])
    Lamb([w], lr=0.5, betas=(0.9, 0.99), eps=0.0, weight_decay=0.1).step()
    update = torch.tensor([1.0, -1.0]) + 0.1 * torch.tensor([3.0, 4.0])
    trust = 5.0 / update.norm()
    expected = torch.tensor([3.0, 4.0]) - 0.5 * trust * update
    assert torch.allclose(w.detach(), expected, rtol=1e-6)


@pytest.mark.slow
def test_fp16_overflow_backs_the_loss_scale_off_without_stopping(corpus, tmp_path,
                                                                 make_config):
    """Bug: fp16 overflow steps counted as bad steps (the run would stop at max_bad_steps),
    the scale never lowered, or the scale missing from the metrics. A scale of 2^40 overflows
    fp16 gradients; the scaler must halve it step by step, skip those steps and train on."""
    cfg = make_config(corpus, tmp_path / "run", precision={"dtype": "fp16",
                                                           "initial_loss_scale": 2.0 ** 40},
                      train={"log_interval": 1, "max_bad_steps": 2, "train_samples": 120})
    state = Trainer(cfg, log=lambda *_: None).run()
    records = _records(tmp_path / "run")
    scales = [r["loss_scale"] for r in records]
    assert scales[0] == 2.0 ** 39  # step 1 overflowed: halved once
    assert min(scales) <= 2.0 ** 37  # and again until the gradients fit in fp16
    assert state.skipped_steps >= 3  # more overflow skips than max_bad_steps allows
    assert state.step == 30 and records[-1]["loss"] < records[0]["loss"]


@pytest.mark.parametrize("fast", [True, False])
def test_auto_precision_picks_bf16_only_where_it_is_fast(corpus, tmp_path, make_config,
                                                         monkeypatch, fast):
    """Bug: ``auto`` left unresolved (autocast with no dtype, MFU against the wrong peak, a
    config.toml that does not say what ran), or bf16 chosen on a CPU whose oneDNN has no bf16
    path (AVX2 only: bf16 matmuls ~100x slower than fp32, the demo would take hours); an
    explicit bf16 there must train, with a warning that names the field."""
    from bloomline.trainer import precision

    monkeypatch.setattr(precision, "fast_low_precision", lambda dtype, device: fast)
    lines = []
    cfg = make_config(corpus, tmp_path / "auto", precision={"dtype": "auto"},
                      train={"train_samples": 4}, schedule={"warmup": 4})
    trainer = Trainer(cfg, log=lines.append)
    want = "bf16" if fast else "fp32"
    assert trainer.precision.name == want and trainer.cfg.precision.dtype == want
    trainer.run()
    assert f'dtype = "{want}"' in (tmp_path / "auto" / "config.toml").read_text()
    assert not any(line.startswith("warning:") for line in lines)

    lines.clear()
    Trainer(make_config(corpus, tmp_path / "bf16", precision={"dtype": "bf16"}),
            log=lines.append)
    warned = [line for line in lines if line.startswith("warning: precision.dtype = 'bf16'")]
    assert len(warned) == (0 if fast else 1), lines


@pytest.mark.skipif(not linear.onednn_available(), reason="torch without oneDNN's linear op")
def test_cpu_fp32_matmul_reaches_the_linear_layers(corpus, tmp_path, make_config):
    """Bug: ``train.cpu_fp32_matmul`` parsed but never applied (the layers keep the import-time
    default), or an unknown backend accepted instead of an error naming the field."""
    before = linear.onednn_linear_enabled()
    try:
        for choice, enabled in (("onednn", True), ("aten", False)):
            Trainer(make_config(corpus, tmp_path / choice, train={"cpu_fp32_matmul": choice}),
                    log=lambda *_: None)
            assert linear.onednn_linear_enabled() is enabled, choice
        with pytest.raises(UserError, match=r"train.cpu_fp32_matmul = 'mkl': expected one of "
                                            r"auto, aten, onednn"):
            Trainer(make_config(corpus, tmp_path / "bad", train={"cpu_fp32_matmul": "mkl"}),
                    log=lambda *_: None)
    finally:
        linear.set_onednn_linear(before)


@pytest.mark.slow
def test_profile_steps_write_a_chrome_trace(corpus, tmp_path, make_config):
    """Bug: --profile-steps accepted but no trace written, or one covering no work."""
    cfg = make_config(corpus, tmp_path / "run", train={"profile_steps": "2:4",
                                                       "train_samples": 24})
    Trainer(cfg, log=lambda *_: None).run()
    trace = tmp_path / "run" / "profile" / "trace_steps_2_4.json"
    events = json.loads(trace.read_text())["traceEvents"]
    # the step's matrix products: the linear layers' (oneDNN in fp32 on CPU, kernels/cpu/linear.py)
    # and attention's
    names = {e.get("name", "") for e in events}
    assert names & {"mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"}, sorted(names)[:50]
    assert "aten::bmm" in names


@pytest.mark.slow
def test_loader_workers_feed_the_same_batches_as_the_main_process(corpus, tmp_path,
                                                                  make_config):
    """Bug: worker processes that reorder, duplicate or drop samples (fp32 losses would
    differ), or a prefetch that breaks at the end of the run."""
    losses = []
    for workers in (0, 2):
        cfg = make_config(corpus, tmp_path / f"w{workers}",
                          data={"num_workers": workers, "prefetch_factor": 2},
                          train={"log_interval": 1, "train_samples": 40})
        Trainer(cfg, log=lambda *_: None).run()
        losses.append([r["loss"] for r in _records(tmp_path / f"w{workers}")])
    assert len(losses[0]) == 10 and losses[0] == losses[1]
