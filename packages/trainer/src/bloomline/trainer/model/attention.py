"""Causal self-attention (positions from ALiBi), three interchangeable kernels.

The fused QKV projection is laid out per head as [heads, 3, head_dim] (BLOOM's layout), so a
column-wise tensor-parallel split of it is a split by heads and HF checkpoints map 1:1.

Kernels (``ModelConfig.attention``; ``auto`` picks eager on CPU and flex on CUDA):
- ``sdpa``: ``F.scaled_dot_product_attention`` with the position encoding's causal bias as an
  additive mask (the fused CPU kernel accumulates the softmax in fp32, but its backward with
  a mask is slower on CPU than the eager ops).
- ``flex``: FlexAttention with the encoding's ``score_mod`` and a causal ``BlockMask``
  (compiled; on GPU it skips the masked blocks instead of materializing an L x L bias).
- ``eager``: explicit matmul, bias add, softmax (fp32 arithmetic with ``softmax_fp32``),
  matmul (the CPU choice). On CPU the scores stay in the compute dtype: ATen's CPU softmax
  computes bf16/fp16 inputs in fp32 and rounds only its output, bitwise what upcasting first
  gives (a test checks it), so no fp32 L x L tensor is written and the backward runs in bf16,
  as Megatron's fused softmax kernels do; the bias is then added in bf16 (exact for
  power-of-two slopes up to L = 256; elsewhere off by at most 2^-9 of its value, which is
  largest where the softmax weight exp(bias) is smallest). Other devices upcast the scores.
  On CPU without dropout the core is one hand-written autograd node
  (``kernels/cpu/attention_core.py``: fewer layout copies, no subnormal fp32 probabilities).
They agree within bf16/fp32 tolerance (tests/model/test_alibi_attention.py). Positions come from
``model/position.py`` (ALiBi). Packed samples whose documents must not see each other take a
per-sample bias (eager, sdpa) or BlockMask (flex) from ``model/documents.py``.
Measurements: docs/perf/cpu-kernels.md.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from bloomline.trainer.kernels.cpu.attention_core import alibi_attention_core, uses_core
from bloomline.trainer.kernels.cpu.linear import Linear
from bloomline.trainer.model.config import ModelConfig
from bloomline.trainer.model.documents import document_bias, document_block_mask, visible_keys
from bloomline.trainer.model.layers import compute_dtype
from bloomline.trainer.model.position import position_encoding

__all__ = ["Attention", "resolve_kernel", "softmax_dtype"]


def resolve_kernel(kernel: str, device: torch.device) -> str:
    """``auto`` -> eager on CPU, flex on CUDA; any other name as it is."""
    if kernel != "auto":
        return kernel
    return "flex" if device.type == "cuda" else "eager"


def softmax_dtype(compute: torch.dtype, device: torch.device, fp32: bool) -> torch.dtype:
    """The dtype the eager kernel adds the bias and runs the softmax in: fp32 when
    ``softmax_fp32`` asks for fp32 arithmetic and the device's kernel would not provide it
    from a lower-precision input (only CPU's is known to), else the compute dtype."""
    if fp32 and device.type != "cpu":
        return torch.float32
    return compute


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=8)
def _causal_block_mask(seq_length: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return create_block_mask(causal, B=None, H=None, Q_LEN=seq_length, KV_LEN=seq_length,
                             device=device)


class Attention(nn.Module):
    """Multi-head causal self-attention over heads ``[head_start, head_start + num_heads)`` of
    a model with ``total_heads`` heads (all of them without tensor parallelism)."""

    def __init__(self, cfg: ModelConfig, head_start: int = 0, num_heads: int | None = None):
        super().__init__()
        self.total_heads = cfg.num_heads
        self.head_start = head_start
        self.num_heads = cfg.num_heads if num_heads is None else num_heads
        self.head_dim = cfg.head_dim
        self.kernel = cfg.attention
        self.softmax_fp32 = cfg.softmax_fp32
        self.dropout = cfg.attention_dropout
        self.position = position_encoding(cfg.position_encoding)
        local = self.num_heads * self.head_dim
        self.query_key_value = Linear(cfg.hidden_size, 3 * local)
        self.dense = Linear(local, cfg.hidden_size)
        # activation stats: when set, forward records max |score + bias| over the causal region
        self.track_max_logit = False
        self.max_logit: torch.Tensor | None = None

    def _bias(self, seq_length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return self.position.bias(self.total_heads, self.head_start,
                                  self.head_start + self.num_heads, seq_length, str(device),
                                  dtype)

    def bias_for(self, seq_length: int, device: torch.device,
                 document_ids: torch.Tensor | None = None):
        """The position encoding's causal bias this layer's kernel adds ([heads, L, L]; None
        for flex, which computes it in its score_mod). With ``document_ids`` [b, L] (attention
        within each document of a packed sample, ``model/documents.py``): the bias with -inf
        across documents, [b, heads, L, L], and for flex the per-sample ``BlockMask``. Built
        outside the layer's forward so that a compiled layer takes it as an input instead of
        tracing the cache."""
        kernel = resolve_kernel(self.kernel, device)
        if kernel == "flex":
            return None if document_ids is None else document_block_mask(document_ids)
        dtype = compute_dtype(self.query_key_value.weight)
        if kernel == "eager":
            dtype = softmax_dtype(dtype, device, self.softmax_fp32)
        bias = self._bias(seq_length, device, dtype)
        return bias if document_ids is None else document_bias(bias, document_ids)

    def forward(self, x: torch.Tensor, bias=None) -> torch.Tensor:
        """``x`` [b, L, hidden] -> [b, L, hidden]; ``bias`` from ``bias_for`` (computed here
        when not given): [heads, L, L], per sample [b, heads, L, L], or flex's BlockMask."""
        seq_length = x.shape[1]
        kernel = resolve_kernel(self.kernel, x.device)
        if bias is None and kernel != "flex":
            bias = self.bias_for(seq_length, x.device)
        qkv = self.query_key_value(x)  # [b, L, heads * 3 * head_dim]
        if self.track_max_logit:
            q, k, _ = self._split_heads(qkv)
            if self.position.rotates_qk:
                q, k = self.position.rotate(q, k)
            self.max_logit = self._max_logit(q, k, bias)
        dropout = self.dropout if self.training else 0.0
        if kernel == "eager":
            return self.dense(self._eager(qkv, bias, dropout))
        q, k, v = self._split_heads(qkv)
        if self.position.rotates_qk:
            q, k = self.position.rotate(q, k)
        if kernel == "sdpa":
            # a 4-D mask keeps the fused CPU kernel (a 3-D one falls back to the generic path,
            # which upcasts bf16 to fp32; docs/perf/cpu-kernels.md)
            mask = bias if bias.dim() == 4 else bias[None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype),
                                                 dropout_p=dropout)
        else:
            out = self._flex(q, k, v, bias)
        return self.dense(self._merge_heads(out))

    def _split_heads(self, qkv: torch.Tensor):
        """[b, L, heads * 3 * head_dim] -> q, k, v views [b, heads, L, head_dim]."""
        batch, seq_length, _ = qkv.shape
        heads = qkv.view(batch, seq_length, self.num_heads, 3, self.head_dim)
        return tuple(t.transpose(1, 2) for t in heads.unbind(dim=3))

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """[b, heads, L, head_dim] -> [b, L, heads * head_dim]."""
        batch, _, seq_length, _ = out.shape
        return out.transpose(1, 2).reshape(batch, seq_length, self.num_heads * self.head_dim)

    def _eager(self, qkv: torch.Tensor, bias: torch.Tensor, dropout: float) -> torch.Tensor:
        """The eager kernel, [b, L, heads * 3 * head_dim] -> [b, L, heads * head_dim]: the unit
        that selective activation checkpointing recomputes. On CPU without dropout the
        hand-written node of kernels/cpu/attention_core.py; otherwise autograd over the ops
        below."""
        if not self.position.rotates_qk and uses_core(qkv, bias, dropout):
            return alibi_attention_core(qkv, bias, self.num_heads)
        q, k, v = self._split_heads(qkv)
        if self.position.rotates_qk:
            q, k = self.position.rotate(q, k)
        # the scale goes on q (L x d) rather than on the scores (L x L)
        scores = torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-1, -2))
        dtype = softmax_dtype(scores.dtype, scores.device, self.softmax_fp32)
        if scores.dtype != dtype:
            scores = scores.float()
        # in place: the matmul's backward does not need its output; a per-sample bias
        # [b, heads, L, L] (documents) adds as it is, a shared one broadcasts over b
        scores.add_(bias.to(dtype))  # no-op cast: bias_for made it in this dtype
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        probs = F.dropout(probs, dropout, self.training)
        return self._merge_heads(torch.matmul(probs, v))

    def _flex(self, q, k, v, block_mask=None) -> torch.Tensor:
        """``block_mask``: the documents' per-sample mask (``bias_for``); None: causal."""
        if self.dropout and self.training:
            raise ValueError("model.attention = 'flex' has no attention dropout; use sdpa or "
                             "eager, or set model.attention_dropout = 0")
        score_mod = self.position.score_mod(self.total_heads, self.head_start,
                                            self.head_start + self.num_heads, q.device)
        mask = (block_mask if block_mask is not None
                else _causal_block_mask(q.shape[2], str(q.device)))
        return _compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=mask)

    @torch.no_grad()
    def _max_logit(self, q: torch.Tensor, k: torch.Tensor, mask=None) -> torch.Tensor:
        """max |q.k / sqrt(d) + bias| over the keys each query sees (the causal region,
        within its document under ``mask``, the forward's bias or BlockMask), one sequence at
        a time (the L x L scores of a whole batch would cost more memory than the step)."""
        length = q.shape[2]
        bias = self._bias(length, q.device, torch.float32)
        per_sample = mask is not None and not (isinstance(mask, torch.Tensor)
                                                and mask.dim() == 3)
        visible = torch.isfinite(bias)
        best = torch.zeros((), device=q.device)
        for i in range(q.shape[0]):
            if per_sample:
                visible = visible_keys(mask, i, length, q.device)
            scores = torch.matmul(q[i].float(), k[i].float().transpose(-1, -2))
            scores = scores / math.sqrt(self.head_dim) + bias
            best = torch.maximum(best, scores.abs().masked_fill(~visible, 0).amax())
        return best
