"""A tensor's raw bits as one integer: the digest the silent-corruption checks compare
between a step's two attempts (``step/recompute.py``) and between data-parallel replicas
(``fingerprints.py``).

The digest is the sum of the tensor's storage words (int16 for bf16/fp16, int32 for fp32)
as int64, wrapping around on overflow. Integer addition is exact and associative, so the
digest does not depend on the reduction order of the device (the same bits give the same
digest on every rank and in every attempt), and one pass over the tensor is all it costs.
Any single flipped bit changes it (by +-2^k, never a multiple of 2^64); two flips cancel only
when they are the same bit in opposite directions, and a permutation of equal words goes
unseen: a check against hardware faults, not a cryptographic hash.
"""

from __future__ import annotations

import torch

__all__ = ["bits_sum", "digest_of"]

_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def bits_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The int64 sum (wrapping) of ``tensor``'s storage words, a 0-d tensor on its device
    (no synchronization: the caller reads it when it needs the value). A DTensor counts its
    local shard."""
    local = _local(tensor).detach()
    if local.dtype == torch.bool:
        local = local.to(torch.uint8)
    words = local.contiguous().view(_WORDS[local.element_size()])
    return words.sum(dtype=torch.int64)


def digest_of(tensors) -> torch.Tensor:
    """The wrapping sum of ``bits_sum`` over ``tensors`` (0-d int64; zero when empty)."""
    total = None
    for tensor in tensors:
        part = bits_sum(tensor)
        total = part if total is None else total + part
    return total if total is not None else torch.zeros((), dtype=torch.int64)
