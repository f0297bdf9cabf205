"""Linear layers whose fp32 CPU products can run on oneDNN instead of MKL.

ATen sends an fp32 CPU ``mm``/``addmm`` to MKL's sgemm and only bf16/fp16 products to oneDNN
(torch uses oneDNN for fp32 only when it may round the inputs to bf16 or tf32, which fp32
training must not do). oneDNN's fp32 matmul computes in fp32 as well (IEEE products in another
summation order: differences of fp32 roundoff). Which is faster depends on the CPU's maker.

Contract: ``auto`` (``TrainConfig.cpu_fp32_matmul``, the default) routes fp32 products to
oneDNN on AMD CPUs and leaves them on ATen elsewhere (Intel, and any CPU nobody has measured);
``aten`` and ``onednn`` force one. The choice is fixed per machine, not timed at run time, so
that a resumed run computes with the same kernels bit for bit.

torch exposes oneDNN's matmul as ``torch.ops.mkldnn._linear_pointwise(x, w, b)`` = ``x @ w.T +
b`` (the op inductor emits for CPU linears), without a backward. ``linear`` wraps it in an
autograd node whose backward runs both gradient products on oneDNN too, the weight gradient
in whichever operand order is faster at its shape (``linear_weight_grad``).

Everything else takes ATen's ``F.linear`` unchanged: other dtypes and autocast (bf16 products
already run on oneDNN), other devices, tensor subclasses (DTensor under tensor parallelism),
compiled regions (inductor picks its own kernels), a torch built without oneDNN, and
``set_onednn_linear(False)``. Measurements: docs/perf/cpu-kernels.md; why this choice:
docs/decisions/cpu-kernels.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bloomline.trainer.kernels.cpu import CPU_FP32_MATMUL_CHOICES

__all__ = ["Linear", "configure_cpu_fp32_matmul", "cpu_vendor",
           "linear", "linear_weight_grad", "matmul_2d", "onednn_available",
           "onednn_linear_enabled", "onednn_matmul", "set_onednn_linear"]


def onednn_available() -> bool:
    """torch built with oneDNN and still exposing its linear op (a private op: a torch that
    renames it falls back to ATen instead of failing)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


def cpu_vendor() -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``; empty where unknown)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _onednn_by_default() -> bool:
    """``auto``: oneDNN on AMD CPUs, where it beats MKL (see the module docstring)."""
    return cpu_vendor() == "AuthenticAMD"


_enabled = onednn_available() and _onednn_by_default()


def set_onednn_linear(enabled: bool) -> None:
    """Route fp32 CPU linear products to oneDNN (where torch has it) or to ATen."""
    global _enabled
    _enabled = bool(enabled) and onednn_available()


def configure_cpu_fp32_matmul(choice: str) -> str:
    """Apply ``TrainConfig.cpu_fp32_matmul`` (one of ``CPU_FP32_MATMUL_CHOICES``) to this
    process; returns the backend that runs fp32 CPU linear products, ``aten`` or ``onednn``
    (``aten`` for an ``onednn`` that this torch lacks)."""
    if choice not in CPU_FP32_MATMUL_CHOICES:
        raise ValueError(f"cpu_fp32_matmul {choice!r}: expected one of "
                         f"{', '.join(CPU_FP32_MATMUL_CHOICES)}")
    set_onednn_linear(_onednn_by_default() if choice == "auto" else choice == "onednn")
    return "onednn" if _enabled else "aten"


def onednn_linear_enabled() -> bool:
    return _enabled


def _fp32(*tensors: torch.Tensor | None) -> bool:
    """Whether a product of ``tensors`` (None: an absent bias) runs on oneDNN's fp32 kernel."""
    if not _enabled or torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return False
    return all(t is None or (type(t) in (torch.Tensor, nn.Parameter) and t.device.type == "cpu"
                             and t.dtype == torch.float32) for t in tensors)


def _onednn(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``a @ weight.T (+ bias)`` on oneDNN; ``a`` [M, K], ``weight`` [N, K], any strides."""
    return torch.ops.mkldnn._linear_pointwise(a, weight, bias, "none", [], "")


def onednn_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-D, CPU) on oneDNN whatever this process routes linear layers to: for
    measuring the machine (``peak.measure_peak_flops``). Not differentiable."""
    return _onednn(a, b.t())


def matmul_2d(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D ``a`` [M, K] and ``b`` [K, N]: oneDNN for fp32 CPU tensors, else ATen.
    Not differentiable on the oneDNN path (for use inside autograd nodes' own formulas)."""
    if _fp32(a, b):
        return _onednn(a, b.t())
    return a @ b


def linear_weight_grad(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``grad_out.T @ x`` ([N, K] from [M, N] and [M, K]): the weight gradient of a linear
    layer, contiguous; oneDNN for fp32 CPU tensors, else ATen. oneDNN packs its second
    operand, and is faster with the wider of the two there (for N >= K, computing the
    transpose ``x.T @ grad_out`` and transposing back; docs/perf/cpu-kernels.md), and a
    contiguous result
    spares autograd's accumulation a copy into the parameter's layout."""
    if not _fp32(grad_out, x):
        return grad_out.t() @ x
    if grad_out.shape[1] >= x.shape[1]:
        return _onednn(x.t(), grad_out.t()).t().contiguous()
    return _onednn(grad_out.t(), x.t())


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad_out, weight.t())
        if ctx.needs_input_grad[1]:
            grad_w = linear_weight_grad(grad_out, x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, on oneDNN for fp32 CPU tensors (see the module docstring)."""
    if not _fp32(x, weight, bias):
        return F.linear(x, weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x2, weight, bias)):
        y = _OneDNNLinear.apply(x2, weight, bias)
    else:
        y = _onednn(x2, weight, bias)
    return y.reshape(*lead, weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` whose fp32 CPU products run on oneDNN (``linear``); the same parameters,
    state-dict keys and tensor-parallel plans as ``nn.Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
