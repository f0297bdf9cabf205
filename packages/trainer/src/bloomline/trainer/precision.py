"""Precision policy, applied from outside the model.

- ``bf16``: parameters stay fp32 (the master weights the optimizer updates); forward and
  backward matmuls run in bf16 under ``torch.autocast``. Autocast casts each weight to bf16 for
  the matmul; the cast's backward returns the weight gradient as fp32, so ``.grad`` is fp32 and
  gradient accumulation across micro-batches (and the data-parallel reduction of it) happen in
  fp32, as Megatron's fp32 ``main_grad`` does. LayerNorm, softmax, the residual stream and the
  loss run in fp32 by the model's own options.
- ``fp16``: the same with float16, plus dynamic loss scaling (``torch.amp.GradScaler``): the
  loss is scaled up before backward, the gradients unscaled before clipping, a step with an
  inf/NaN gradient is skipped and the scale halved; the scale doubles after
  ``loss_scale_window`` clean steps.
- ``fp32``: no autocast, no scaler.
"""

from __future__ import annotations

import contextlib

import torch

from bloomline.trainer.config import PrecisionConfig

__all__ = ["Precision"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Precision:
    def __init__(self, cfg: PrecisionConfig, device: torch.device) -> None:
        self.name = cfg.dtype
        self.dtype = _DTYPES[cfg.dtype]
        self.device = device
        self.scaler = None
        if cfg.dtype == "fp16":
            self.scaler = torch.amp.GradScaler(device.type, init_scale=cfg.initial_loss_scale,
                                               growth_interval=cfg.loss_scale_window)

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    @property
    def loss_scale(self) -> float | None:
        return float(self.scaler.get_scale()) if self.scaler is not None else None

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
