"""The training every parallel layout must reproduce: ``run_steps`` trains the tiny model for a
few steps on fixed random batches and returns the losses and final parameters.

Called in one process it is the reference; called on every rank of ``run_distributed`` with
``parallel`` settings it is the layout under test. Each dp rank takes its micro-batches from
the same global batch in Megatron's order (block k of ``mbs x dp`` samples, rank r's slice
``[r * mbs, (r + 1) * mbs)``), so every layout sees the same samples in each step.
"""

from __future__ import annotations

import torch

from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer

__all__ = ["equivalence_config", "run_steps", "assert_same_training"]

VOCAB, SEQ, MBS, GBS, LR = 128, 16, 2, 8, 3e-3


def equivalence_config(run_dir: str = "", **sections) -> Config:
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = VOCAB, 32, 4, 4
    cfg.data.seq_length = SEQ
    cfg.train.micro_batch_size, cfg.train.global_batch_size = MBS, GBS
    cfg.train.device, cfg.train.run_dir = "cpu", run_dir or "/nonexistent"
    cfg.precision.dtype = "fp32"
    cfg.optimizer.lr, cfg.optimizer.clip_grad = LR, 1.0
    cfg.monitor.tensorboard = False
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


def run_steps(sections: dict, steps: int = 5, seed: int = 0) -> dict:
    """Train ``steps`` steps; returns {"losses": [...], "grad_norms": [...], "params": {...}}
    (params gathered to full tensors on every rank)."""
    trainer = Trainer(equivalence_config(**sections), log=lambda *_: None)
    dp, dp_rank = trainer.layout.dp, trainer.layout.dp_rank
    generator = torch.Generator().manual_seed(seed)
    losses, norms = [], []
    for _ in range(steps):
        batch = torch.randint(0, VOCAB, (GBS, SEQ + 1), generator=generator)
        micro = [batch[k * MBS * dp + dp_rank * MBS: k * MBS * dp + (dp_rank + 1) * MBS]
                 for k in range(GBS // (MBS * dp))]
        result = trainer.train_step(micro, LR)
        losses.append(result["loss"])
        norms.append(result["grad_norm"])
    return {"losses": losses, "grad_norms": norms, "params": trainer.full_model_state()}


def assert_same_training(reference: dict, result: dict, loss_rtol: float = 1e-5,
                         param_atol: float = 1e-5) -> None:
    """Losses within ``loss_rtol`` relative, every parameter within ``param_atol``."""
    for step, (want, got) in enumerate(zip(reference["losses"], result["losses"], strict=True)):
        assert abs(got - want) <= loss_rtol * abs(want), f"step {step}: loss {got} vs {want}"
    assert reference["params"].keys() == result["params"].keys()
    for name, want in reference["params"].items():
        got = result["params"][name]
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
        error = (got - want).abs().max().item()
        assert error <= param_atol, f"{name}: max |difference| {error:.3g} > {param_atol}"
