"""A tensor's raw bits as one integer: the digest the silent-corruption checks compare
between a step's two attempts (``step/recompute.py``) and between data-parallel replicas
(``fingerprints.py``).

The digest is the sum of the tensor's bytes read as int64 words (8 bytes at a time; a tail
of fewer than 8 bytes byte by byte), wrapping around on overflow. Integer addition is exact
and associative, so the digest does not depend on the reduction order of the device (the same
bits give the same digest on every rank and in every attempt), and one pass over the tensor
is all it costs: a native int64 sum, at memory speed (summing fp32's int32 words into int64
instead converts each word, ten times slower on a CPU). Any single flipped bit changes it (by
+-2^k, never a multiple of 2^64); two flips cancel only when they are the same bit in
opposite directions, and a permutation of equal words goes unseen: a check against hardware
faults, not a cryptographic hash.
"""

from __future__ import annotations

import torch

__all__ = ["bits_sum", "digest_of"]

def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def bits_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The int64 sum (wrapping) of ``tensor``'s bytes as int64 words, a 0-d tensor on its
    device (no synchronization: the caller reads it when it needs the value). A DTensor
    counts its local shard."""
    local = _local(tensor).detach()
    if local.dtype == torch.bool:
        local = local.to(torch.uint8)
    raw = local.contiguous().view(-1).view(torch.uint8)
    whole = raw.numel() // 8 * 8
    try:  # a view that starts off an 8-byte boundary cannot be read as int64 in place
        total = raw[:whole].view(torch.int64).sum()
    except RuntimeError:
        total = raw[:whole].clone().view(torch.int64).sum()
    if whole < raw.numel():
        total = total + raw[whole:].sum(dtype=torch.int64)
    return total


def digest_of(tensors) -> torch.Tensor:
    """The wrapping sum of ``bits_sum`` over ``tensors`` (0-d int64; zero when empty)."""
    total = None
    for tensor in tensors:
        part = bits_sum(tensor)
        total = part if total is None else total + part
    return total if total is not None else torch.zeros((), dtype=torch.int64)
