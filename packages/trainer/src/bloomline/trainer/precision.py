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
- ``auto``: bf16 where the device multiplies bf16 matrices natively, else fp32
  (``resolve_dtype``). A CPU without oneDNN's AVX-512 bf16 path (an AVX2-only machine) runs
  bf16 matmuls through a far slower reference kernel: ``auto`` picks fp32 there, and an
  explicit ``bf16``/``fp16`` on such a CPU gets a warning instead (measurements:
  docs/perf/trainer-step.md).
"""

from __future__ import annotations

import contextlib

import torch

from bloomline.trainer.config import PrecisionConfig

__all__ = ["Precision", "fast_low_precision", "resolve_dtype"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def fast_low_precision(dtype: str, device: torch.device) -> bool:
    """Whether ``device`` runs ``dtype`` ("bf16" or "fp16") matmuls at least as fast as fp32:
    on CUDA, bf16 needs compute capability 8.0 (Ampere) or newer; on a CPU, oneDNN's bf16 and
    fp16 kernels need AVX-512 (native with AVX512-BF16/AMX, emulated without), the check
    torch's own mkldnn path makes."""
    if device.type == "cuda":
        return dtype == "fp16" or torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        if dtype == "bf16":
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True  # other backends: trust the user's choice


def resolve_dtype(cfg: PrecisionConfig, device: torch.device) -> str | None:
    """Resolve ``auto`` in place (bf16 if the device is fast at it, else fp32). Returns a
    one-line warning when an explicit bf16/fp16 will be slow on this device, else None."""
    if cfg.dtype == "auto":
        cfg.dtype = "bf16" if fast_low_precision("bf16", device) else "fp32"
        return None
    if cfg.dtype in ("bf16", "fp16") and not fast_low_precision(cfg.dtype, device):
        what = ("this CPU has no AVX-512 path for it in oneDNN" if device.type == "cpu"
                else "this GPU has no native support for it")
        return (f"warning: precision.dtype = {cfg.dtype!r}: {what}, so its matmuls run far "
                "slower than fp32; precision.dtype = \"auto\" picks fp32 here")
    return None


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
