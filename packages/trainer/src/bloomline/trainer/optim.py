"""Optimizers (AdamW, LAMB) with Megatron's weight-decay groups, and the LR schedule.

The learning rate is a pure function of how far training has gone (samples or tokens), so a
resumed run needs no scheduler state beyond the counters in the checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bloomline.trainer.config import OptimizerConfig, ScheduleConfig

__all__ = ["Lamb", "build_optimizer", "learning_rate", "parameter_groups"]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay the matrices (Linear weights, embedding); not biases and LayerNorm parameters,
    as Megatron and BLOOM do (decaying a norm's gain toward 0 fights the normalization)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2020): Adam's update scaled per tensor by the trust ratio
    ||w|| / ||update||, as in NVIDIA's FusedLAMB / Megatron (bias-corrected moments, decoupled
    weight decay inside the update, ratio 1 where either norm is 0). torch ships no LAMB."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"].item()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(p.grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (exp_avg / (1 - beta1 ** step)) / (
                    (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                weight_norm, update_norm = p.norm(), update.norm()
                trust = torch.where((weight_norm > 0) & (update_norm > 0),
                                    weight_norm / update_norm, torch.ones_like(weight_norm))
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.name == "lamb":
        return Lamb(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
    # fused: one kernel over all tensors, faster than foreach (docs/perf/trainer-step.md)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, fused=True)


def learning_rate(progress: int, total: int, optimizer: OptimizerConfig,
                  schedule: ScheduleConfig) -> float:
    """LR after ``progress`` samples (or tokens) of ``total``: linear warmup from 0 to the peak,
    then cosine or linear decay to min_lr over ``schedule.decay`` (default: the rest), then
    min_lr (Megatron's OptimizerParamScheduler)."""
    peak, floor = optimizer.lr, optimizer.min_lr
    if schedule.warmup and progress < schedule.warmup:
        return peak * progress / schedule.warmup
    if schedule.style == "constant":
        return peak
    decay = schedule.decay or max(total - schedule.warmup, 1)
    ratio = min(max(progress - schedule.warmup, 0) / decay, 1.0)
    if schedule.style == "linear":
        coefficient = 1.0 - ratio
    else:
        coefficient = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return floor + (peak - floor) * coefficient
