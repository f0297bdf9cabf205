"""BLOOM's tensor names <-> ours, and the check that a state dict fits a config.

The model follows BLOOM name for name and layout for layout (fused QKV per head as
[heads, 3, head_dim]), so conversion is the ``transformer.`` prefix and the tied head; no
tensor is reshaped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from bloomline.trainer.hf.bloom_config import HFInteropError
from bloomline.trainer.model import GPT, ModelConfig

__all__ = ["PREFIX", "check_tensors", "from_hf_state_dict", "to_hf_state_dict"]

PREFIX = "transformer."
_HEAD = "lm_head.weight"
_EMBEDDING = "word_embeddings.weight"


def to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> BloomForCausalLM's (``transformer.`` prefix). ``lm_head.weight`` is left
    out, as transformers' own writer does: it is tied to ``transformer.word_embeddings.weight``
    and the loader re-ties it. Tensors are made contiguous (no copy when they already are)."""
    return {PREFIX + name: tensor.contiguous() for name, tensor in state_dict.items()}


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BloomForCausalLM's (or BloomModel's, unprefixed) names -> ours.

    ``lm_head.weight`` is dropped: it is optional (tied), and when present must equal the
    embedding, since our head is always tied.

    Raises:
        HFInteropError: when ``lm_head.weight`` differs from the word embeddings.
    """
    out = {name.removeprefix(PREFIX): tensor.contiguous()
           for name, tensor in hf_state_dict.items() if name != _HEAD}
    head = hf_state_dict.get(_HEAD)
    embedding = out.get(_EMBEDDING)
    if head is not None and embedding is not None and not (
            head.shape == embedding.shape and torch.equal(head, embedding)):
        raise HFInteropError(f"{_HEAD}: differs from {PREFIX}{_EMBEDDING}; an untied LM head "
                             "is not supported")
    return out


def check_tensors(state_dict: Mapping[str, torch.Tensor], cfg: ModelConfig, where: str,
                   display: Callable[[str], str]) -> None:
    """Every tensor of a GPT(cfg) present with its shape, nothing else; names shown through
    ``display`` (the caller's naming)."""
    with torch.device("meta"):  # shapes only, no memory
        expected = {name: p.shape for name, p in GPT(cfg).state_dict().items()}
    missing = [display(n) for n in expected if n not in state_dict]
    if missing:
        raise HFInteropError(f"{where}: missing tensors {', '.join(missing)}")
    unexpected = [display(n) for n in state_dict if n not in expected]
    if unexpected:
        raise HFInteropError(f"{where}: unexpected tensors {', '.join(unexpected)}")
    for name, shape in expected.items():
        if state_dict[name].shape != shape:
            raise HFInteropError(f"{where}: {display(name)} has shape "
                                 f"{list(state_dict[name].shape)}, the config needs "
                                 f"{list(shape)}")
