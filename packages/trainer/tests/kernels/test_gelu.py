"""BLOOM's tanh GELU: the fused CPU kernel (sigmoid form, compiled) against ATen's tanh form."""

from __future__ import annotations

import warnings

import pytest
import torch

from bloomline.trainer.kernels.cpu import gelu

# above FUSED_MIN_ELEMENTS, so the compiled kernel runs; an odd last size exercises the
# vectorized loop's remainder
SHAPE = (2, 1024, 515)


def _inputs(dtype):
    torch.manual_seed(0)
    # wide range: both tails (x -> 0 and x -> identity) and the curved middle
    x = (torch.randn(SHAPE) * 4).to(dtype).requires_grad_()
    return x, torch.randn(SHAPE).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_fused_gelu_matches_aten_forward_and_backward(dtype, tol):
    """Catches: a wrong constant or a wrong derivative in the sigmoid form (an error in the
    cubic term's slope shows up as ~1e-2 in the gradient), or the bf16 kernel rounding its
    intermediates to bf16 (errors of several bf16 ulps). Tolerance: in fp32 the roundoff of
    O(1-10) values and gradients (incoming gradient x slope up to 1.13); in bf16 two ulps
    (rtol 1.6e-2 = 2 x 2^-7) of outputs up to |x| ~ 16."""
    assert SHAPE[0] * SHAPE[1] * SHAPE[2] >= gelu.FUSED_MIN_ELEMENTS
    x, grad = _inputs(dtype)
    fused = gelu.bloom_gelu(x)
    assert fused.grad_fn is not None and "FusedGelu" in type(fused.grad_fn).__name__
    (fused_grad,) = torch.autograd.grad(fused, x, grad)
    reference = gelu.gelu_reference(x)
    (reference_grad,) = torch.autograd.grad(reference, x, grad)
    assert fused.dtype == dtype and fused_grad.dtype == dtype
    torch.testing.assert_close(fused, reference, atol=tol, rtol=tol)
    torch.testing.assert_close(fused_grad, reference_grad, atol=tol, rtol=tol)


def test_fused_gelu_without_grad_matches_aten():
    """Catches: the inference path (no autograd node) taking a different kernel or dtype."""
    x, _ = _inputs(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(gelu.bloom_gelu(x), gelu.gelu_reference(x),
                                   atol=2e-6, rtol=2e-6)


def test_small_tensors_take_aten_kernel_exactly():
    """Catches: tiny tensors paying the per-process compile (seconds) for nothing: below the
    threshold the result is ATen's, bit for bit."""
    x = torch.randn(4, 64, requires_grad=True)
    y = gelu.bloom_gelu(x)
    assert torch.equal(y, gelu.gelu_reference(x))
    assert "FusedGelu" not in type(y.grad_fn).__name__


def test_compile_failure_falls_back_to_aten_with_one_warning(monkeypatch):
    """Catches: a host without a working C++ compiler crashing the run instead of using
    ATen's kernel, or warning on every call."""
    def broken():
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(gelu, "_kernels", broken)
    monkeypatch.setattr(gelu, "_fused_available", True)
    x, grad = _inputs(torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = gelu.bloom_gelu(x)
        gelu.bloom_gelu(x)
    assert [str(w.message) for w in caught if "GELU" in str(w.message)] == [
        "bloomline: the fused CPU GELU kernel failed to compile (RuntimeError: no compiler "
        "here); using ATen's tanh GELU (slower)"]
    assert torch.equal(y, gelu.gelu_reference(x))
    (g,) = torch.autograd.grad(y, x, grad)
    (expected,) = torch.autograd.grad(gelu.gelu_reference(x), x, grad)
    assert torch.equal(g, expected)
