"""BLOOM's GELU (the tanh approximation), with a CPU kernel that avoids ATen's slow ``tanh``.

``0.5 * x * (1 + tanh(u))`` with ``u = sqrt(2 / pi) * (x + 0.044715 * x^3)`` is the same
function as ``x * sigmoid(2u)`` (``(1 + tanh(u)) / 2 = sigmoid(2u)``), which needs one
``exp`` instead of a ``tanh``. On CPU this module compiles both directions of the sigmoid
form once per process (inductor: one vectorized C++ loop each, computing in fp32 and rounding
once to the input's dtype, as ATen does).

- Inside a compiled region (``train.compile``) the plain sigmoid form is returned: inductor
  fuses it with its neighbours and differentiates it itself.
- On other devices, and for tensor subclasses (DTensor under tensor parallelism), ATen's
  ``F.gelu(approximate="tanh")`` runs: on GPU it is memory-bound, not ``tanh``-bound.
- Tensors under ``FUSED_MIN_ELEMENTS`` (2^20) take ATen's kernel: the per-process compile
  costs more than it saves on small tensors (tests, generation, tiny models).
- If compiling fails (no C++ compiler on the host), a warning says so once and ATen's kernel
  takes over for the rest of the process.

The two forms agree within fp32 roundoff (tests/kernels/test_gelu.py). Measurements:
docs/perf/cpu-kernels.md.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F

__all__ = ["bloom_gelu", "gelu_reference"]

_TWO_SQRT_2_OVER_PI = 2.0 * math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """ATen's tanh-approximated GELU: the definition the fused kernel must match."""
    return F.gelu(x, approximate="tanh")


def _sigmoid_form(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.sigmoid(_TWO_SQRT_2_OVER_PI * (xf + _CUBIC * xf * xf * xf))).to(x.dtype)


def _sigmoid_form_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # d/dx [x * s(v)] = s + x * s * (1 - s) * dv/dx, v = 2 sqrt(2/pi) (x + c x^3)
    xf = x.float()
    s = torch.sigmoid(_TWO_SQRT_2_OVER_PI * (xf + _CUBIC * xf * xf * xf))
    slope = s + xf * s * (1.0 - s) * _TWO_SQRT_2_OVER_PI * (1.0 + 3.0 * _CUBIC * xf * xf)
    return (grad.float() * slope).to(grad.dtype)


@functools.cache
def _kernels():
    # dynamic: one kernel for every shape (curriculum learning changes the sequence length)
    return (torch.compile(_sigmoid_form, dynamic=True),
            torch.compile(_sigmoid_form_grad, dynamic=True))


_fused_available = True
# below this many elements ATen's kernel runs (see the module docstring)
FUSED_MIN_ELEMENTS = 1 << 20


def _run(index: int, *tensors: torch.Tensor) -> torch.Tensor:
    """Compiled kernel ``index`` (0 forward, 1 backward), or ATen's once compiling failed."""
    global _fused_available
    if _fused_available:
        try:
            # autocast off: the kernels cast explicitly, and one autocast state means one graph
            with torch.autocast("cpu", enabled=False):
                return _kernels()[index](*tensors)
        except Exception as error:  # noqa: BLE001 (any compiler failure: fall back, say so)
            _fused_available = False
            warnings.warn(f"bloomline: the fused CPU GELU kernel failed to compile "
                          f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                          "using ATen's tanh GELU (slower)", RuntimeWarning, stacklevel=3)
    if index == 0:
        return gelu_reference(tensors[0])
    grad, x = tensors
    return torch.ops.aten.gelu_backward(grad, x, approximate="tanh")


class _FusedGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _run(0, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _run(1, grad.contiguous(), x)


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh-approximated GELU of BLOOM, fastest form for where ``x`` lives."""
    if torch.compiler.is_compiling():
        return _sigmoid_form(x)
    if (x.device.type != "cpu" or type(x) is not torch.Tensor or not _fused_available
            or x.numel() < FUSED_MIN_ELEMENTS):
        return gelu_reference(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _FusedGelu.apply(x)
    return _run(0, x)
