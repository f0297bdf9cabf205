"""The language-model losses of the training step and of evaluation, in one place.

Contract: every loss is fp32 next-token cross-entropy whatever the logits' dtype; labels of
-100 are ignored. Logits sharded by vocabulary (a DTensor under tensor parallelism) need
``loss_parallel()`` around the call and the backward; losses come back as plain tensors. The
fused head + cross-entropy that spares the logits lives with the model (``model/loss.py``);
these functions take materialized logits (tensor and pipeline parallelism, tests).

Why sums per source and not means: dp ranks and pp stages add them up before anyone divides.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

__all__ = ["lm_loss", "per_sample_means", "source_totals", "token_cross_entropy"]


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` [b, L, V] against ``labels`` [b, L]."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
    return loss.to_local() if isinstance(loss, DTensor) else loss  # replicated over tp


def token_cross_entropy(logits: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``lm_loss`` and each token's loss [b, L] (detached) from one log-softmax."""
    tokens = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    loss = tokens.sum() / (labels >= 0).sum()  # ignored labels (-100) count 0, as "mean" does
    if isinstance(tokens, DTensor):  # replicated over tp
        tokens, loss = tokens.to_local(), loss.to_local()
    return loss, tokens.detach().view(labels.shape)


def per_sample_means(token_losses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[b, L] token losses (0 where a label is ignored) -> [b] mean over each sample's
    counted tokens, fp32."""
    counts = (labels >= 0).sum(dim=1).clamp(min=1)
    return token_losses.float().sum(dim=1) / counts


def source_totals(per_sample: torch.Tensor, sources: torch.Tensor,
                  num_sources: int) -> torch.Tensor:
    """[2, num_sources] float64: per dataset of a blend, the sum of its samples' losses
    (``per_sample`` [b]) and their count (``sources`` [b]: each sample's dataset number)."""
    totals = torch.zeros(2, num_sources, dtype=torch.float64, device=per_sample.device)
    sources = sources.to(per_sample.device)
    totals[0].index_add_(0, sources, per_sample.double())
    totals[1].index_add_(0, sources, torch.ones_like(per_sample, dtype=torch.float64))
    return totals
