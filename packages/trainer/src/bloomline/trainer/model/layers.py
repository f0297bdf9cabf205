"""Numerics-controlled building blocks: a LayerNorm that can run in fp32 under any compute dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LayerNorm", "compute_dtype"]


def compute_dtype(reference: torch.Tensor) -> torch.dtype:
    """The dtype matmuls run in: the autocast dtype when autocast is on, else the weights'."""
    device_type = reference.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return reference.dtype


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that, with ``fp32``, normalizes in fp32 (statistics of bf16 activations
    in bf16 lose the small variances that signal trouble) and hands the result on in the dtype
    the next matmul computes in."""

    def __init__(self, hidden_size: int, eps: float, fp32: bool) -> None:
        super().__init__(hidden_size, eps=eps)
        self.fp32 = fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fp32:
            return super().forward(x)
        out_dtype = compute_dtype(self.weight)
        with torch.autocast(x.device.type, enabled=False):
            y = F.layer_norm(x.float(), self.normalized_shape, self.weight.float(),
                             self.bias.float(), self.eps)
        return y.to(out_dtype) if out_dtype != torch.float32 else y
