"""Documents in a packed sample: which keys a query may see when attention stays within each
document (Megatron's ``--reset-attention-mask``).

Contract: a sample's document ids ``[b, L]`` number its documents from 0; a query attends to a
key only when both hold the same id and the key is not after it. ``document_ids`` gives them
from the input tokens by Megatron's rule (megatron-core's ``_get_ltor_masks_and_position_ids``):
after an end-of-document token at position i, positions > i do not attend to positions <= i,
so a token's id is the number of EOD tokens strictly before it (an exclusive cumsum; the EOD
itself still belongs to the document it ends).

ALiBi needs no position reset: its bias ``slope * (j - i)`` is relative, so once the keys of
other documents are masked every score a query keeps carries the distance it would have if
its document started the sample (``tests/model/test_document_masking.py`` checks each
document's logits against the document run alone).

- ``document_bias``: the eager and sdpa kernels' bias [b, heads, L, L], the position bias
  with -inf across documents; built once per forward and shared by all layers (b x heads x
  L^2 elements in the softmax dtype: one layer's scores, once per forward, not per layer).
- ``document_block_mask``: FlexAttention's ``BlockMask`` (causal and same document, per
  sample); the position bias stays flex's ``score_mod``. On a GPU it skips whole blocks of
  other documents instead of materializing any L x L tensor.
- ``visible_keys``: one sample's [L, L] visibility under either, for readings outside the
  kernels (``Attention._max_logit``).
"""

from __future__ import annotations

import torch

__all__ = ["document_bias", "document_block_mask", "document_ids", "visible_keys"]


def document_ids(inputs: torch.Tensor, eod: int) -> torch.Tensor:
    """[b, L] int32: how many ``eod`` tokens come strictly before each position of ``inputs``
    [b, L] (one cumsum on the inputs' device)."""
    ends = (inputs == eod).to(torch.int32)
    return torch.cumsum(ends, dim=1, dtype=torch.int32) - ends


def document_bias(bias: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``bias`` [heads, L, L] (causal already) with -inf where query and key lie in different
    documents of ``ids`` [b, L]: [b, heads, L, L], in ``bias``'s dtype."""
    same = (ids[:, :, None] == ids[:, None, :])[:, None]  # [b, 1, L, L]
    return torch.where(same, bias, torch.full((), float("-inf"), dtype=bias.dtype,
                                              device=bias.device))


def document_block_mask(ids: torch.Tensor):
    """FlexAttention's ``BlockMask`` for ``ids`` [b, L]: causal and within one document, one
    mask per sample (B = b), shared by the heads."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (ids[b, q_idx] == ids[b, kv_idx])

    batch, length = ids.shape
    return create_block_mask(causal_document, B=batch, H=None, Q_LEN=length, KV_LEN=length,
                             device=ids.device)


def visible_keys(mask, sample: int, length: int, device: torch.device) -> torch.Tensor:
    """[L, L] bool: the keys each query of ``sample`` sees under ``mask``: a bias [heads, L, L]
    or [b, heads, L, L] (finite entries, taken from the first head) or a ``BlockMask`` (its
    ``mask_mod``, evaluated on the whole grid)."""
    if isinstance(mask, torch.Tensor):
        return torch.isfinite(mask[sample, 0] if mask.dim() == 4 else mask[0])
    positions = torch.arange(length, device=device)
    return mask.mask_mod(torch.tensor(sample, device=device), torch.tensor(0, device=device),
                         positions[:, None], positions[None, :])
