"""The planner's two memory figures against a real run: for the tiny recipe, the peak memory
of a real CPU training step (measured by torch's profiler from the allocator's events), the
traced step's on fake tensors (``traced_step``) and the formulas' (``memory_formulas``)
agree within 10%.

The real step is the trainer's: the model built and parallelized as ``Trainer`` does (world
1: activation checkpointing is the only transform), ``ForwardBackward`` over the step's
micro-batches and the optimizer, one warm-up step first (so that the optimizer state exists,
as in every later step). fp32, as on a CPU without a fast bf16 path, so that the test means
the same on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from bloomline.trainer.config import load_trainer_config
from bloomline.trainer.forward_backward import ForwardBackward, loss_functions
from bloomline.trainer.model import GPT
from bloomline.trainer.optim import build_optimizer
from bloomline.trainer.parallel import parallelize, resolve_layout
from bloomline.trainer.plan.memory_formulas import rank_memory
from bloomline.trainer.plan.planner import formula_layout
from bloomline.trainer.plan.rank_build import build_rank
from bloomline.trainer.plan.traced_step import trace_step
from bloomline.trainer.precision import Precision

TINY = Path(__file__).resolve().parents[3] / "configs" / "tiny-cpu.toml"


def _measured_peak(cfg, scratch: Path) -> int:
    """Peak bytes of live CPU tensors during one real training step of ``cfg`` (world 1)."""
    torch.manual_seed(0)
    model = GPT(cfg.model)
    parallelize(model, None, resolve_layout(cfg, 1, 0), cfg)
    optimizer = build_optimizer(model, cfg.optimizer)
    precision = Precision(cfg.precision, torch.device("cpu"))
    loss_fn, loss_context = loss_functions(False, 1)
    step = ForwardBackward(model, precision, torch.device("cpu"), 1, loss_fn, loss_context,
                           None)
    count = cfg.train.global_batch_size // cfg.train.micro_batch_size
    shape = (cfg.train.micro_batch_size, cfg.data.seq_length + 1)
    batches = [torch.randint(0, cfg.model.vocab_size, shape) for _ in range(count)]

    def train_step():
        step.run(batches)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        train_step()
    timeline = scratch / "memory.json"
    prof.export_memory_timeline(str(timeline), device="cpu")
    _times, sizes = json.loads(timeline.read_text())
    return max(sum(row) for row in sizes)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_real_traced_and_formula_peaks_agree_within_10_percent(recompute, tmp_path):
    """The bug: a traced step or a formula that misses what a real step holds (the
    optimizer state, the accumulated gradients during the second micro-batch, the fused
    loss's logits and gradients, the attention scores the CPU kernel stores), or counts what
    it does not (the recomputed block's activations at the same time as the logits)."""
    cfg = load_trainer_config(TINY, ["model.vocab_size=8064", "precision.dtype=fp32",
                                     "train.micro_batch_size=4", "train.global_batch_size=8",
                                     f"parallel.activation_checkpoint={recompute}"])
    measured = _measured_peak(cfg, tmp_path)
    traced = trace_step(cfg, 1, 0, "cpu")
    formula = rank_memory(formula_layout(cfg, build_rank(cfg, 1, 0), "cpu"), 0)["total"]
    assert traced.attention == "eager" and traced.dtype == "fp32"
    assert traced.at_peak["optimizer"] > 0 and traced.at_peak["gradients"] > 0
    for name, value in (("traced", traced.peak_bytes), ("formula", formula)):
        assert value == pytest.approx(measured, rel=0.10), (name, value, measured)
