"""ALiBi slopes and the three attention kernels."""

from __future__ import annotations

import math

import pytest
import torch

from bloomline.trainer.model import ModelConfig, alibi_bias, alibi_slopes
from bloomline.trainer.model import attention as attention_module
from bloomline.trainer.model.attention import Attention


def test_slopes_power_of_two_follow_the_paper():
    """Catches: a wrong geometric ratio (the paper: 2^-8/n, then its powers)."""
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))


def test_slopes_non_power_of_two_interleave_the_next_power():
    """Catches: padding non-powers of two with the lower sequence or taking the wrong half
    (BLOOM-176B has 112 heads): 6 heads = 4-head slopes + every other 8-head slope."""
    expected = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected))
    assert len(alibi_slopes(112)) == 112


def test_slopes_by_head_range_are_the_slice_tensor_parallel_ranks_need():
    """Catches: a rank recomputing slopes for its local head count (rank 1 of 2 with 6 heads
    would get the 3-head sequence instead of heads 3..5 of the 6-head one)."""
    full = alibi_slopes(6)
    assert torch.equal(torch.cat([alibi_slopes(6, 0, 3), alibi_slopes(6, 3, 6)]), full)


def test_bias_is_causal_and_relative():
    bias = alibi_bias(torch.tensor([0.5]), 4)[0]
    assert torch.isinf(bias[0, 1]) and bias[0, 1] < 0
    assert bias[3, 0] == -1.5 and bias[3, 3] == 0


def _attention(kernel: str, heads: int, dtype=torch.float32) -> Attention:
    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=48, num_heads=heads, attention=kernel)
    return Attention(cfg).to(dtype)


@pytest.mark.parametrize("heads", [4, 6])
def test_sdpa_matches_eager_reference(heads):
    """Catches: a bias broadcast over the wrong axis or a missing scale in the fused path.
    Tolerance: fp32 roundoff, 1e-5."""
    x = torch.randn(2, 20, 48)
    eager = _attention("eager", heads)
    sdpa = _attention("sdpa", heads)
    sdpa.load_state_dict(eager.state_dict())
    torch.testing.assert_close(sdpa(x), eager(x), atol=1e-5, rtol=1e-5)


def test_bf16_paths_agree_within_bf16_tolerance():
    """Catches: the bf16 sdpa path dropping the fp32 softmax accumulation (errors would grow
    to ~1e-1). Tolerance: a few bf16 ulps of O(1) outputs, 3e-2."""
    x = torch.randn(2, 64, 48)
    eager = _attention("eager", 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = eager(x).float()
        eager.kernel = "sdpa"
        fused = eager(x).float()
    torch.testing.assert_close(fused, reference, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_softmax_of_low_precision_is_fp32_arithmetic(dtype):
    """Catches: a torch whose CPU softmax computes bf16/fp16 inputs in their own precision.
    The eager kernel's ``softmax_fp32`` relies on it to keep the scores in bf16 on CPU, so
    this must hold bit for bit: softmax(x) == softmax(x.float()).to(dtype), masked rows and
    a length that is not a multiple of the vector width included."""
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 37, 261) * 8).to(dtype)
    x[..., 200:] = float("-inf")
    assert torch.equal(torch.softmax(x, -1), torch.softmax(x.float(), -1).to(dtype))


def test_eager_bf16_on_cpu_keeps_scores_bf16_and_matches_the_fp32_round_trip(monkeypatch):
    """Catches: the bf16 eager path adding the bias with the wrong broadcast or sign, or
    losing the fp32 softmax (the old path upcast the scores to fp32: the reference here).
    Tolerance: outputs within 1e-2 (a bf16 ulp is 2^-8 relative; the paths differ in where
    the bias add rounds); each gradient within 2% of its norm (sums over 128 tokens of
    bf16-rounded terms; a wrong bias gives O(1))."""
    torch.manual_seed(0)
    x = torch.randn(2, 64, 48, requires_grad=True)
    layer = _attention("eager", 6)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
        grads = torch.autograd.grad(out.float().square().sum(), [x, *layer.parameters()])
        return out.float(), grads

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer.bias_for(64, x.device).dtype == torch.bfloat16
    out, grads = run()
    monkeypatch.setattr(attention_module, "softmax_dtype", lambda *_: torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer.bias_for(64, x.device).dtype == torch.float32
    reference, reference_grads = run()
    torch.testing.assert_close(out, reference, atol=1e-2, rtol=1e-2)
    for grad, expected in zip(grads, reference_grads, strict=True):
        assert (grad - expected).norm() <= 0.02 * expected.norm()


@pytest.mark.slow
def test_flex_attention_matches_sdpa_on_cpu():
    """Catches: a score_mod with the sign of the distance flipped or a non-causal block mask
    in the GPU path (compiled FlexAttention; CPU runs its forward only). Tolerance 1e-4."""
    x = torch.randn(1, 128, 48)
    sdpa = _attention("sdpa", 6)
    flex = _attention("flex", 6)
    flex.load_state_dict(sdpa.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(flex(x), sdpa(x), atol=1e-4, rtol=1e-4)


def test_max_logit_activation_stat_sees_the_largest_visible_score():
    """Catches: the activation stat reading masked (future) positions or forgetting the scale."""
    attention = _attention("eager", 4)
    attention.track_max_logit = True
    x = torch.randn(1, 8, 48)
    attention(x)
    qkv = attention.query_key_value(x).view(1, 8, 4, 3, 12)
    q, k = qkv[..., 0, :].transpose(1, 2), qkv[..., 1, :].transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(12) + alibi_bias(alibi_slopes(4), 8)
    expected = scores[torch.isfinite(scores)].abs().max()
    torch.testing.assert_close(attention.max_logit, expected.detach())
