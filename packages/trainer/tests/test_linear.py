"""model/linear.py: fp32 CPU linear layers on oneDNN, ATen everywhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bloomline.trainer.model import linear as lin

# a torch with oneDNN but without its linear op runs, and fails here on purpose: the fallback
# is correct but gives up the fp32 speed, which someone should notice
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="torch built without oneDNN")


def _grad_fn_names(t: torch.Tensor) -> set[str]:
    names, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.add(type(fn).__name__)
            todo.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


@pytest.mark.parametrize("features", [(24, 40), (40, 24)], ids=["widening", "narrowing"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_onednn_linear_matches_aten_forward_and_backward(features, with_bias):
    """Bug: a transposed operand in one of the backward products, the wrong weight-gradient
    branch for wide or narrow layers (both shapes run), a lost bias gradient, or a silent
    fallback to ATen (the oneDNN node must be in the graph). Tolerance: fp32 roundoff of a
    different summation order, 1e-5 relative to values of O(1-10)."""
    torch.manual_seed(0)
    fan_in, fan_out = features
    x = torch.randn(3, 5, fan_in, requires_grad=True)
    w = torch.randn(fan_out, fan_in, requires_grad=True)
    b = torch.randn(fan_out, requires_grad=True) if with_bias else None
    leaves = [x, w] + ([b] if with_bias else [])

    y = lin.linear(x, w, b)
    assert "_OneDNNLinearBackward" in _grad_fn_names(y)
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, leaves, grad)
    ref_y = F.linear(x, w, b)
    reference = torch.autograd.grad(ref_y, leaves, grad)

    assert y.shape == ref_y.shape
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    for name, got, want in zip("xwb"[:len(leaves)], ours, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"grad of {name}")
        assert got.is_contiguous(), name


def test_onednn_products_match_aten():
    """Bug: ``matmul_2d`` or ``linear_weight_grad`` (the fused loss's products) computing a
    transpose of what they promise, in either operand order."""
    torch.manual_seed(1)
    a, b = torch.randn(33, 20), torch.randn(20, 7)
    torch.testing.assert_close(lin.matmul_2d(a, b), a @ b, rtol=1e-5, atol=1e-5)
    for cols in (7, 50):  # grad_out narrower, then wider, than x
        grad_out, x = torch.randn(33, cols), torch.randn(33, 20)
        got = lin.linear_weight_grad(grad_out, x)
        torch.testing.assert_close(got, grad_out.t() @ x, rtol=1e-5, atol=1e-5)
        assert got.is_contiguous()


def test_no_grad_and_grad_paths_agree_bitwise():
    """Bug: evaluation (no grad: generation, the valid split) computing other numbers than
    training's forward."""
    torch.manual_seed(2)
    x, w, b = torch.randn(6, 16), torch.randn(12, 16, requires_grad=True), torch.randn(12)
    with torch.no_grad():
        plain = lin.linear(x, w, b)
    assert torch.equal(lin.linear(x, w, b), plain)


def test_aten_runs_where_onednn_must_not():
    """Bug: the fp32 oneDNN node under autocast (it would compute the bf16 precision's
    matmuls in fp32), on bf16 tensors, or after ``set_onednn_linear(False)``: each must be
    exactly ATen's ``F.linear``."""
    torch.manual_seed(3)
    x, w, b = torch.randn(4, 8, 16), torch.randn(32, 16), torch.randn(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin.linear(x, w, b)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, F.linear(x, w, b))
    xb, wb = x.bfloat16(), w.bfloat16()
    assert torch.equal(lin.linear(xb, wb), F.linear(xb, wb))
    lin.set_onednn_linear(False)
    try:
        assert not lin.onednn_linear_enabled()
        w.requires_grad_(True)
        y = lin.linear(x, w, b)
        assert "_OneDNNLinearBackward" not in _grad_fn_names(y)
        assert torch.equal(y, F.linear(x, w, b))
    finally:
        lin.set_onednn_linear(True)
    assert lin.onednn_linear_enabled()


def test_linear_module_is_an_nn_linear_with_its_state_dict():
    """Bug: swapping nn.Linear for the oneDNN module renaming parameters (HF export, old
    checkpoints) or hiding it from tensor-parallel plans and init that match nn.Linear."""
    module = lin.Linear(16, 8)
    assert isinstance(module, torch.nn.Linear)
    assert set(module.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 16)
    torch.testing.assert_close(module(x), F.linear(x, module.weight, module.bias),
                               rtol=1e-5, atol=1e-5)
