"""ALiBi (Press et al., 2022): a per-head linear penalty on query-key distance, no positions.

Head h (of n) gets slope m_h; the score of query i on key j gets ``m_h * (j - i)`` added
(<= 0 for the keys a causal query may see). For n a power of two the slopes are the geometric
sequence 2^(-8/n), 2^(-16/n), ... For other n, the paper (and BLOOM) take the n' slopes of the
closest lower power of two n', then every other slope of the sequence for 2n' until n are
filled. Tensor parallelism gives each rank a contiguous range of heads, so slopes are
selectable by head range: a rank computes exactly its own heads' slopes.

``AlibiPositions`` is ALiBi as a ``PositionEncoding`` (``position.py``): a bias, no rotation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

__all__ = ["AlibiPositions", "alibi_bias", "alibi_slopes", "cached_alibi_bias"]


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(num_heads: int, head_start: int = 0, head_end: int | None = None) -> torch.Tensor:
    """The fp32 slopes of heads ``[head_start, head_end)`` of a model with ``num_heads`` heads."""
    if num_heads < 1:
        raise ValueError(f"num_heads {num_heads}: must be at least 1")
    head_end = num_heads if head_end is None else head_end
    if not 0 <= head_start <= head_end <= num_heads:
        raise ValueError(f"heads [{head_start}, {head_end}) not within [0, {num_heads})")
    lower = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(lower)
    if lower < num_heads:
        slopes += _power_of_two_slopes(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes[head_start:head_end], dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, seq_length: int, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention bias [heads, L, L]: ``slope * (j - i)`` on and below the diagonal,
    -inf above it (causal). Relative distances rather than BLOOM's absolute ``slope * j``:
    the softmax is the same (a constant per row), and the values stay small in low precision.
    """
    positions = torch.arange(seq_length, device=device, dtype=torch.float32)
    distance = positions[None, :] - positions[:, None]  # j - i
    bias = slopes.to(device)[:, None, None] * distance
    bias = bias.masked_fill(distance > 0, float("-inf"))
    return bias.to(dtype)


@functools.lru_cache(maxsize=4)
def cached_alibi_bias(num_heads: int, head_start: int, head_end: int, seq_length: int,
                      device: str, dtype: torch.dtype) -> torch.Tensor:
    """``alibi_bias`` of heads ``[head_start, head_end)``, built once per process and shared by
    every layer (all layers of a rank hold the same heads): one [heads, L, L] tensor instead
    of one per layer, which at 176B's 112 heads x 2048^2 in fp32 would be 1.9 GB each."""
    return alibi_bias(alibi_slopes(num_heads, head_start, head_end), seq_length, device, dtype)


class AlibiPositions:
    """ALiBi through the position-encoding seam: the causal bias of ``alibi_bias`` (cached,
    one tensor per head range, L and dtype) and the same penalty as a flex ``score_mod``;
    q and k are left as they are."""

    rotates_qk = False

    def bias(self, total_heads: int, head_start: int, head_end: int, seq_length: int,
             device: str, dtype: torch.dtype) -> torch.Tensor:
        return cached_alibi_bias(total_heads, head_start, head_end, seq_length, device, dtype)

    def score_mod(self, total_heads: int, head_start: int, head_end: int,
                  device: torch.device) -> Callable:
        slopes = alibi_slopes(total_heads, head_start, head_end).to(device)

        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        return alibi

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k
