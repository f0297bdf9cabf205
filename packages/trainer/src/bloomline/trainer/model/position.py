"""The position-encoding seam: how attention learns where each token sits.

Contract: a ``PositionEncoding`` gives an attention layer, for heads ``[head_start,
head_end)`` of a model with ``total_heads`` heads,

- ``bias``: the additive score bias [heads, L, L] of the eager and sdpa kernels, with the
  causal mask (-inf above the diagonal) included, in the dtype asked for; an encoding without
  a bias of its own returns the causal mask alone (it may broadcast over heads);
- ``score_mod``: the same bias as FlexAttention's ``score_mod`` (None: scores unchanged; the
  causal mask is a block mask there);
- ``rotate(q, k)``: q and k [b, heads, L, head_dim] as the scores should see them; only
  called when ``rotates_qk`` is true (an encoding that rotates cannot use the fused CPU core,
  which takes the unrotated QKV projection).

The bias is built once per forward (``GPT.attention_bias``) and shared by every block: all
layers of a rank hold the same heads. ``model.position_encoding`` names the encoding; ALiBi
(``alibi.py``) is the only one today. Why a seam: another encoding (rotary) is then one module
and one entry in ``ENCODINGS``, not edits in attention, the GPT and the parallel code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from bloomline.trainer.model.alibi import AlibiPositions

__all__ = ["ENCODINGS", "PositionEncoding", "position_encoding"]


class PositionEncoding(Protocol):
    """What attention asks of a position encoding (see the module docstring)."""

    rotates_qk: bool

    def bias(self, total_heads: int, head_start: int, head_end: int, seq_length: int,
             device: str, dtype: torch.dtype) -> torch.Tensor: ...

    def score_mod(self, total_heads: int, head_start: int, head_end: int,
                  device: torch.device) -> Callable | None: ...

    def rotate(self, q: torch.Tensor,
               k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


# model.position_encoding -> the encoding; model/config.py accepts exactly these names
ENCODINGS: dict[str, Callable[[], PositionEncoding]] = {"alibi": AlibiPositions}


def position_encoding(name: str) -> PositionEncoding:
    """The encoding ``model.position_encoding`` names.

    Raises:
        ValueError: An unknown name (the message lists the known ones).
    """
    if name not in ENCODINGS:
        raise ValueError(f"model.position_encoding {name!r}: unknown; one of "
                         + ", ".join(repr(n) for n in ENCODINGS))
    return ENCODINGS[name]()
