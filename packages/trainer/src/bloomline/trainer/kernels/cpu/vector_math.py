"""The first call of MKL's vector math in a process, made where it cannot race.

ATen computes ``exp``, ``log``, ``tanh``, ``sqrt``, ``erf`` and a dozen other elementwise
functions of contiguous fp32/fp64 CPU tensors with MKL's VML (``vmsExp`` and so on, in
``ATen/cpu/vml.h``), which threads large calls itself. The first such call of a process was
measured to give other bits now and then: with 2 threads, the first ``exp`` of a
[64, 128] fp32 tensor differed in 1 process of 40 (a 13-ulp different loss at step 1 of a
tiny run, 1 run in 10; ``MKL_CBWR=AUTO,STRICT`` did not change it), every later call agreed,
and no difference was seen in 160 processes whose first ``exp`` was of 16 elements, made by
one thread. A resume must repeat an uninterrupted run bit for bit, and a resumed process makes
its first calls at another step than the run it continues, so ``warm_vector_math`` makes the
first call of each function once, on a few elements, before anything is computed.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["warm_vector_math"]

# the ATen ops that reach MKL's VML (IMPLEMENT_VML_MKL in ATen/cpu/vml.h, torch 2.x)
_VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10",
            "log2", "sin", "sqrt", "tan", "tanh", "trunc")


@functools.cache
def warm_vector_math() -> None:
    """Call every VML-backed op once per process on 16 fp32 and fp64 elements (one thread;
    microseconds). A no-op after the first call, and harmless where torch has no MKL."""
    for dtype in (torch.float32, torch.float64):
        x = torch.linspace(0.1, 0.9, 16, dtype=dtype)  # inside every op's domain
        for name in _VML_OPS:
            getattr(torch, name)(x)
