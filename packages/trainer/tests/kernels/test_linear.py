"""kernels/cpu/linear.py: fp32 CPU linear layers on oneDNN where chosen, ATen everywhere else."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from trainer_fixtures import grad_fn_names

from bloomline.trainer.kernels.cpu import linear as lin

# a torch with oneDNN but without its linear op runs, and fails here on purpose: the fallback
# is correct but gives up the fp32 speed, which someone should notice
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def onednn_route():
    """Every test here starts on the oneDNN route, whatever this machine's default, and leaves
    the process's choice as it found it."""
    before = lin.onednn_linear_enabled()
    lin.set_onednn_linear(True)
    yield
    lin.set_onednn_linear(before)




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
    assert "_OneDNNLinearBackward" in grad_fn_names(y)
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
    assert not lin.onednn_linear_enabled()
    w.requires_grad_(True)
    y = lin.linear(x, w, b)
    assert "_OneDNNLinearBackward" not in grad_fn_names(y)
    assert torch.equal(y, F.linear(x, w, b))


@pytest.mark.parametrize(("vendor", "choice", "backend"), [
    ("AuthenticAMD", "auto", "onednn"), ("GenuineIntel", "auto", "aten"), ("", "auto", "aten"),
    ("GenuineIntel", "onednn", "onednn"), ("AuthenticAMD", "aten", "aten")])
def test_cpu_fp32_matmul_choice_follows_the_cpu_vendor_unless_forced(monkeypatch, vendor,
                                                                      choice, backend):
    """Bug: ``auto`` sending Intel CPUs to oneDNN (150 ms of a ~960 ms step slower than MKL
    there), keeping AMD CPUs on MKL (~10% slower there), or an unmeasured CPU off ATen; a
    forced choice ignored; the returned name disagreeing with what the layers then run."""
    monkeypatch.setattr(lin, "cpu_vendor", lambda: vendor)
    assert lin.configure_cpu_fp32_matmul(choice) == backend
    assert lin.onednn_linear_enabled() == (backend == "onednn")
    w = torch.randn(4, 8, requires_grad=True)
    on_onednn = "_OneDNNLinearBackward" in grad_fn_names(lin.linear(torch.randn(2, 8), w))
    assert on_onednn == (backend == "onednn")
    with pytest.raises(ValueError, match="cpu_fp32_matmul 'mkl'"):
        lin.configure_cpu_fp32_matmul("mkl")


def test_cpu_vendor_reads_this_machine():
    """Bug: a parser that never finds the vendor (``auto`` would then be ATen everywhere,
    silently giving up oneDNN's gain on AMD)."""
    if not Path("/proc/cpuinfo").exists() or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("no /proc/cpuinfo on an x86 machine")
    assert lin.cpu_vendor() in ("GenuineIntel", "AuthenticAMD", "HygonGenuine")


def test_linear_module_is_an_nn_linear_with_its_state_dict():
    """Bug: swapping nn.Linear for the oneDNN module renaming parameters (HF export, old
    checkpoints) or hiding it from tensor-parallel plans and init that match nn.Linear."""
    module = lin.Linear(16, 8)
    assert isinstance(module, torch.nn.Linear)
    assert set(module.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 16)
    torch.testing.assert_close(module(x), F.linear(x, module.weight, module.bias),
                               rtol=1e-5, atol=1e-5)
