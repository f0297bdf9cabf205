"""The eager CPU attention core (scores, bias, softmax, mixing) as one autograd node.

Contract: ``alibi_attention_core(qkv, bias, heads)`` computes the unfused path's math,
``softmax(q k^T / sqrt(d) + bias) v``, with the scale applied to q, the bias added in the
scores' dtype, ATen's softmax and softmax backward (which compute bf16 inputs in fp32); q, k
and v come out of the fused QKV projection [b, L, heads, 3, d] through one permuting copy,
and their gradients go back through one. fp32 probabilities below ``_PROBABILITY_FLOOR``
(1e-30) are set to zero in place, which keeps them and the score gradients
``p * (dp - delta)`` out of fp32's subnormal range; the outputs change by no more than fp32
roundoff (a test checks it). ``uses_core`` says when it applies: dropout, other devices,
tensor subclasses and compiled regions take the autograd path in ``model/attention.py``.

Why: autograd over the views copies q, k and v one by one, and x86 multiplies subnormal
operands slowly; measurements: docs/perf/cpu-kernels.md.
"""

from __future__ import annotations

import math

import torch

__all__ = ["alibi_attention_core", "attention_probabilities", "attention_probabilities_backward",
           "uses_core"]

_PROBABILITY_FLOOR = 1e-30


def uses_core(qkv: torch.Tensor, bias: torch.Tensor, dropout: float) -> bool:
    """Whether ``alibi_attention_core`` serves this call (plain CPU tensors, no dropout, not
    inside a compiled region, bias already in the scores' dtype)."""
    return (dropout == 0.0 and qkv.device.type == "cpu" and type(qkv) is torch.Tensor
            and type(bias) is torch.Tensor and bias.dtype == qkv.dtype
            and not torch.compiler.is_compiling())


def attention_probabilities(scores: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``softmax(scores + bias)`` over the last axis, the bias added into ``scores`` in place
    (``scores`` [b, heads, L, L], ``bias`` [heads, L, L] shared by the batch or [b, heads,
    L, L] per sample: documents masked apart); fp32 probabilities below
    ``_PROBABILITY_FLOOR`` are set to zero (see the module docstring)."""
    scores.add_(bias)
    probs = torch.softmax(scores, dim=-1)
    if probs.dtype == torch.float32:
        torch.nn.functional.threshold_(probs, _PROBABILITY_FLOOR, 0.0)
    return probs


def attention_probabilities_backward(grad_probs: torch.Tensor,
                                     probs: torch.Tensor) -> torch.Tensor:
    """The gradient of the scores from that of ``attention_probabilities``' output: ATen's
    softmax backward, ``probs * (grad_probs - sum(grad_probs * probs))`` per row (exact for
    the floored probabilities too: a floored entry is a constant zero, its gradient zero)."""
    return torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)


class _AlibiAttentionCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
        batch, seq, width = qkv.shape
        head_dim = width // (3 * num_heads)
        scale = 1.0 / math.sqrt(head_dim)
        # (b, L, heads, 3, d) -> (3, b * heads, L, d), one copy
        parts = qkv.view(batch, seq, num_heads, 3, head_dim).permute(3, 0, 2, 1, 4)
        parts = parts.reshape(3, batch * num_heads, seq, head_dim)
        q, k, v = parts.unbind(0)
        scores = torch.bmm(q * scale, k.transpose(1, 2))  # (b * heads, L, L)
        probs = attention_probabilities(scores.view(batch, num_heads, seq, seq), bias)
        probs = probs.view(batch * num_heads, seq, seq)
        out = torch.bmm(probs, v)  # (b * heads, L, d)
        ctx.save_for_backward(parts, probs)
        ctx.scale = scale
        # (b, heads, L, d) -> (b, L, heads * d): the layout the output projection reads
        return out.view(batch, num_heads, seq, head_dim).transpose(1, 2).reshape(
            batch, seq, num_heads * head_dim)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        parts, probs = ctx.saved_tensors
        _, batch_heads, seq, head_dim = parts.shape
        batch = grad_out.shape[0]
        num_heads = batch_heads // batch
        q, k, v = parts.unbind(0)
        grad = grad_out.view(batch, seq, num_heads, head_dim).transpose(1, 2).reshape(
            batch_heads, seq, head_dim)
        grads = torch.empty_like(parts)  # (3, b * heads, L, d): dq, dk, dv
        torch.bmm(probs.transpose(1, 2), grad, out=grads[2])
        grad_probs = torch.bmm(grad, v.transpose(1, 2))  # (b * heads, L, L)
        grad_scores = attention_probabilities_backward(grad_probs, probs)
        del grad_probs
        torch.bmm(grad_scores, k, out=grads[0]).mul_(ctx.scale)
        torch.bmm(grad_scores.transpose(1, 2), q, out=grads[1]).mul_(ctx.scale)
        # (3, b, heads, L, d) -> (b, L, heads, 3, d), one copy
        grad_qkv = grads.view(3, batch, num_heads, seq, head_dim).permute(1, 3, 2, 0, 4)
        return grad_qkv.reshape(batch, seq, num_heads * 3 * head_dim), None, None


def alibi_attention_core(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``qkv`` [b, L, heads * 3 * d] (BLOOM's per-head [3, d] layout), ``bias`` [heads, L, L]
    or per sample [b, heads, L, L], in ``qkv``'s dtype -> attention output [b, L, heads * d],
    before the output projection."""
    with torch.autocast("cpu", enabled=False):  # the dtypes are the caller's, as given
        return _AlibiAttentionCore.apply(qkv, bias, num_heads)
