"""The ``bitflip`` fault (``BLOOMLINE_FAULTS``, see :mod:`bloomline.common.faults`): silent
data corruption on demand, for the tests of the recompute (``step/recompute.py``) and of the
replica fingerprints (``fingerprints.py``).

- ``bitflip@grad:step=N:rank=R``: on rank R, step N's gradient gets one bit flipped before the
  data-parallel reduction (on the buffers engine in the first bucket it reduces; without data
  parallelism right after backward), in the step's first attempt only: a transient fault,
  which the recompute of the step does not meet again. Default bit: the exponent's highest
  (a gradient element below 1 in magnitude becomes 2^128 times larger, the norm overflows).
- ``bitflip@param:step=N:rank=R``: on rank R, after step N's optimizer step, one parameter
  element (of those the replicas hold alike) gets one bit flipped, once. Default bit: the
  lowest of the mantissa (a silent change of one part in 2^7 (bf16) or 2^23 (fp32)).

Both flip the element of largest magnitude of the tensor (never a zero, where a flip of the
exponent would stay small; for the exponent's top bit the largest below 1, which it makes
2^128 times larger); ``bit=K`` picks another bit (0: the lowest).
"""

from __future__ import annotations

import os

import torch

from bloomline.common.faults import active_faults, condition_holds

__all__ = ["bitflip_due", "flip_bit"]

_WORDS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitflip_due(point: str, step: int) -> int | None:
    """The bit a ``bitflip@POINT`` fault flips at step ``step`` on this rank (announced on
    stderr), or None when none holds here. ``bit`` < 0: the default of the point."""
    for action, at, where in active_faults():
        if action != "bitflip" or at != point:
            continue
        if condition_holds({k: v for k, v in where.items() if k != "bit"}, {"step": step}):
            os.write(2, f"fault: bitflip@{point} {{'step': {step}}}\n".encode())
            return int(where.get("bit", -1))
    return None


def flip_bit(tensor: torch.Tensor, bit: int, high_exponent: bool) -> None:
    """Flip ``bit`` of the element of largest magnitude of ``tensor`` (a floating tensor, or a
    DTensor's local shard; for the exponent's top bit the largest below 1), in place.
    ``bit`` < 0: the exponent's highest bit with ``high_exponent``, else the mantissa's
    lowest."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if local.numel() == 0:
        raise ValueError("bitflip: the tensor holds no element")
    width = local.element_size() * 8
    if bit < 0:
        bit = width - 2 if high_exponent else 0  # below the sign bit: the exponent's top
    flat = local.detach().view(-1)  # a view: the flip lands in the tensor itself
    magnitude = flat.abs().float()
    if high_exponent and bit == width - 2:
        # below 1 the exponent's top bit is clear and setting it leaves the value finite,
        # 2^128 times larger (from [1, 2) it would give inf or NaN, from above a tiny value)
        below = magnitude.where(magnitude < 1, torch.zeros_like(magnitude))
        magnitude = below if bool(below.any()) else magnitude
    index = int(magnitude.argmax())
    mask = 1 << bit
    if mask >= 1 << (width - 1):  # the sign bit as the signed word type holds it
        mask -= 1 << width
    words = flat.view(_WORDS[local.element_size()])
    words[index] ^= mask
