"""The LM head and its cross-entropy in one autograd node, without fp32 logits.

``F.cross_entropy(logits.float(), labels)`` after the head writes the logits again in fp32,
runs ATen's log-softmax forward and backward (a slow kernel on CPU), zero-fills and scatters
an fp32 [tokens, vocab] gradient and casts it back. ``LinearCrossEntropy`` instead:

1. computes the logits in the compute dtype (one matmul, as before);
2. walks them in row chunks small enough to stay in cache, each upcast to fp32 once: the
   log-sum-exp and the loss, then the gradient of the mean loss, ``(softmax - onehot) / n``,
   written over the chunk's logits in place (the logits are not needed afterwards);
3. runs both gradient matmuls at once (into the hidden states and into the tied weight), so
   the backward only scales them by the incoming gradient.

The numerics are those of the unfused path (fp32 softmax statistics and loss; the gradient
rounded to the compute dtype before the matmuls, as autocast's backward does), and so is the
memory: one [tokens, vocab] buffer in the compute dtype. fp16 keeps the unfused path (its
gradient must be rounded after the loss scale, which the forward does not know). Labels < 0
are ignored, as ``F.cross_entropy``'s ``ignore_index = -100``. Tensor-parallel
(vocabulary-sharded) logits do not come here: they go through ``loss_parallel``
(bloomline.trainer.loop.lm_loss). Measurements: docs/perf/cpu-kernels.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bloomline.trainer.kernels.cpu.linear import linear, linear_weight_grad, matmul_2d

__all__ = ["LinearCrossEntropy", "linear_cross_entropy"]

# fp32 bytes of logits handled per chunk: on CPU a chunk that stays in a core's L2 cache
# (2 MiB); on GPU a bound on the temporary's memory that keeps kernel launches few (a 250k
# vocabulary gives 256 rows a chunk)
_CHUNK_BYTES = 1 << 21
_CHUNK_BYTES_GPU = 1 << 28


class LinearCrossEntropy(torch.autograd.Function):
    """``forward(hidden [n, h], weight [V, h], labels [n], rows) -> (mean loss, row losses)``:
    the fp32 mean, and with ``rows`` the fp32 loss of each row (0 where ignored; else an empty
    tensor), not differentiable: read by per-dataset evaluation and the per-source train loss,
    which need each sample's loss, not only the batch's mean."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                rows: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        logits = linear(hidden, weight)  # [n, V], the compute dtype
        # a tensor, not an int: reading it would wait for the GPU
        count = (labels >= 0).sum().to(torch.float32)
        want_grad = any(ctx.needs_input_grad[:2])
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # (n,) fp32: the per-row losses this loop computes anyway, kept when asked for
        row_losses = torch.empty(logits.shape[0] if rows else 0, dtype=torch.float32,
                                 device=hidden.device)
        budget = _CHUNK_BYTES if hidden.device.type == "cpu" else _CHUNK_BYTES_GPU
        rows_per_chunk = max(1, budget // (4 * logits.shape[1]))
        for start in range(0, logits.shape[0], rows_per_chunk):
            chunk = logits[start:start + rows_per_chunk]
            target = labels[start:start + rows_per_chunk]
            valid = target >= 0
            picked = target.clamp(min=0).unsqueeze(1)
            target_logit = chunk.gather(1, picked).float()
            scores = chunk.float()  # in fp32 this is the chunk itself, overwritten below
            top = scores.amax(dim=1, keepdim=True)
            probs = scores.sub_(top).exp_()
            sums = probs.sum(dim=1, keepdim=True)
            # loss per row: log-sum-exp - target logit = log(sum) + max - target logit
            losses = sums.log() + top - target_logit
            losses = losses.squeeze(1).masked_fill(~valid, 0.0)
            total += losses.sum()
            if rows:
                row_losses[start:start + rows_per_chunk] = losses
            if want_grad:
                # d(mean loss)/d(logits) = (softmax - onehot) / count, zero on ignored rows
                probs.mul_(valid.unsqueeze(1) / (sums * count))
                probs.scatter_add_(1, picked, valid.unsqueeze(1) / -count)
                chunk.copy_(probs)
        if want_grad:
            ctx.save_for_backward(
                linear_weight_grad(logits, hidden) if ctx.needs_input_grad[1] else None,
                matmul_2d(logits, weight) if ctx.needs_input_grad[0] else None)
        ctx.mark_non_differentiable(row_losses)
        return total / count, row_losses  # NaN when every label is ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_rows: torch.Tensor):
        grad_weight, grad_hidden = ctx.saved_tensors
        scale = grad_loss.to(grad_hidden.dtype if grad_hidden is not None else grad_weight.dtype)
        if grad_hidden is not None:
            grad_hidden = grad_hidden * scale
        if grad_weight is not None:
            grad_weight = grad_weight * scale
        return grad_hidden, grad_weight, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         token_losses: bool = False
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross-entropy of ``hidden [..., h] @ weight[V, h].T`` against ``labels
    [...]`` (ignored where < 0), in fp32, with the matmuls in the compute dtype (autocast's
    when it is on, else the weight's). With ``token_losses``: (mean, the fp32 loss of every
    token, shaped as ``labels``, 0 where ignored, detached)."""
    device_type = hidden.device.type
    dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
             else weight.dtype)
    with torch.autocast(device_type, enabled=False):
        if dtype == torch.float16:
            # fp16's range needs the loss scale applied before the gradient is rounded to it,
            # and the fused node rounds it in the forward, unscaled: fp16 takes the plain path
            logits = F.linear(hidden.to(dtype), weight.to(dtype)).float().flatten(0, -2)
            loss = F.cross_entropy(logits, labels.flatten())
            if not token_losses:
                return loss
            with torch.no_grad():
                rows = F.cross_entropy(logits, labels.flatten(), reduction="none")
            return loss, rows.masked_fill(labels.flatten() < 0, 0.0).view(labels.shape)
        loss, rows = LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]).to(dtype),
                                              weight.to(dtype), labels.reshape(-1),
                                              token_losses)
        return (loss, rows.view(labels.shape)) if token_losses else loss
