"""kernels/cpu/attention_core.py: the hand-written eager CPU attention node against autograd
over the plain formula, and when the model uses it."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_fixtures import grad_fn_names

from bloomline.trainer.kernels.cpu.attention_core import (
    alibi_attention_core,
    attention_probabilities,
)
from bloomline.trainer.model import ModelConfig, alibi_bias, alibi_slopes
from bloomline.trainer.model.attention import Attention

HEADS, HEAD_DIM = 6, 8  # 6 heads: non-power-of-two slopes, the steepest 0.5


def _reference(qkv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The unfused formula over views, as autograd sees it: softmax(q k^T / sqrt(d) + bias) v."""
    batch, seq, _ = qkv.shape
    q, k, v = qkv.view(batch, seq, HEADS, 3, HEAD_DIM).unbind(3)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = (q / math.sqrt(HEAD_DIM)) @ k.transpose(-1, -2) + bias
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM)


def _inputs(seq: int, dtype: torch.dtype):
    torch.manual_seed(0)
    qkv = torch.randn(2, seq, HEADS * 3 * HEAD_DIM).to(dtype).requires_grad_(True)
    bias = alibi_bias(alibi_slopes(HEADS), seq, dtype=dtype)
    return qkv, bias


def test_fp32_core_matches_autograd_over_the_formula_where_probabilities_go_subnormal():
    """Bug: a transposed operand or a missing scale in one of the hand-written gradients, q/k/v
    taken from the wrong slots of BLOOM's [heads, 3, d] layout, the bias broadcast over the
    wrong axis, or the probability floor changing results beyond fp32 roundoff. L = 300 puts
    the 0.5-slope head's far keys 90-150 below the best score: the reference has subnormal
    and zero probabilities (asserted), the core floors them. Tolerance: 1e-5 absolute on
    O(1) values, fp32 roundoff of different summation orders."""
    qkv, bias = _inputs(300, torch.float32)
    scores = torch.randn(2, HEADS, 300, 300) + bias
    plain = torch.softmax(scores, dim=-1)
    assert ((plain > 0) & (plain < torch.finfo(torch.float32).tiny)).any()

    grad = torch.randn(2, 300, HEADS * HEAD_DIM)
    out = alibi_attention_core(qkv, bias, HEADS)
    (got,) = torch.autograd.grad(out, qkv, grad)
    want_out = _reference(qkv, bias)
    (want,) = torch.autograd.grad(want_out, qkv, grad)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_probability_floor_leaves_no_subnormals_and_keeps_the_rest():
    """Bug: the floor missing (x86 multiplies subnormal operands ~2x slower: the reason it
    exists), applied to bf16 (no need there), or cutting probabilities that matter."""
    torch.manual_seed(1)
    bias = alibi_bias(alibi_slopes(HEADS), 300)
    scores = torch.randn(2, HEADS, 300, 300)
    plain = torch.softmax(scores + bias, dim=-1)
    probs = attention_probabilities(scores.clone(), bias)
    tiny = torch.finfo(torch.float32).tiny
    assert not ((probs > 0) & (probs < tiny)).any()
    kept = plain > 1e-30
    assert torch.equal(probs[kept], plain[kept]) and not probs[~kept].any()
    low = attention_probabilities(scores.bfloat16(), bias.bfloat16())
    assert torch.equal(low, torch.softmax(scores.bfloat16() + bias.bfloat16(), dim=-1))


def test_bf16_core_matches_autograd_over_the_formula():
    """Bug: the node computing bf16 in another precision than the unfused path (autocast is
    off inside it: the dtypes must be the caller's). Tolerance: bf16 roundoff, 2e-2 on O(1)
    values; gradients within 2% of their norm."""
    qkv, bias = _inputs(64, torch.bfloat16)
    grad = torch.randn(2, 64, HEADS * HEAD_DIM).bfloat16()
    out = alibi_attention_core(qkv, bias, HEADS)
    assert out.dtype == torch.bfloat16
    (got,) = torch.autograd.grad(out, qkv, grad)
    want_out = _reference(qkv, bias)
    (want,) = torch.autograd.grad(want_out, qkv, grad)
    torch.testing.assert_close(out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    assert (got.float() - want.float()).norm() <= 0.02 * want.float().norm()




@pytest.mark.parametrize(("dropout", "training", "core"),
                         [(0.0, True, True), (0.1, False, True), (0.1, True, False)])
def test_eager_attention_uses_the_core_unless_dropout_is_active(dropout, training, core):
    """Bug: the core (which has no dropout) serving a layer that trains with attention
    dropout, or the model never reaching the core at all."""
    torch.manual_seed(2)
    layer = Attention(ModelConfig(hidden_size=HEADS * HEAD_DIM, num_heads=HEADS,
                                  attention="eager", attention_dropout=dropout))
    layer.train(training)
    out = layer(torch.randn(2, 16, HEADS * HEAD_DIM))
    assert ("_AlibiAttentionCoreBackward" in grad_fn_names(out)) == core
