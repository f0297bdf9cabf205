"""BLOOM's ``config.json`` <-> our ``ModelConfig``, and the error for what cannot cross.

HF's ``vocab_size`` is the embedding's row count, i.e. our padded ``ModelConfig.vocab_size``.
BLOOM's config cannot express an MLP width other than 4h, an untied head, the post-LN
residual or a position encoding other than ALiBi; those raise :class:`HFInteropError` naming
the field. Fields BLOOM does not record (how we compute: kernels, fp32 islands) come from a
``base`` config.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from bloomline.common.config_loader import Range
from bloomline.common.errors import UserError
from bloomline.trainer.model import ModelConfig

__all__ = ["HFInteropError", "bloom_config", "model_config_from_bloom", "read_model_config"]


class HFInteropError(UserError, ValueError):
    """A config or checkpoint that cannot cross between bloomline and BLOOM. A UserError so the
    CLI prints one line, and a ValueError because it is a bad value of a named field."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bloom_config(cfg: ModelConfig, vocab_size: int | None = None, *,
                 dtype: torch.dtype = torch.float32, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict:
    """The ``BloomConfig`` fields (config.json) of a model with config ``cfg``.

    Args:
        cfg: our model config.
        vocab_size: HF's vocab_size; defaults to, and must equal, ``cfg.vocab_size`` (HF's
            vocab_size is the embedding's row count, i.e. our padded vocabulary).
        dtype: the dtype the weights are saved in (``torch_dtype`` / ``dtype``).
        bos_token_id, eos_token_id, pad_token_id: the tokenizer's special ids. Written even
            when None, so that transformers does not assume BLOOM's own ids (1, 2).

    Raises:
        HFInteropError: naming the field BLOOM cannot express.
    """
    if vocab_size is not None and vocab_size != cfg.vocab_size:
        raise HFInteropError(f"vocab_size {vocab_size}: must equal model.vocab_size "
                             f"{cfg.vocab_size} (the embedding's rows, padded)")
    if cfg.ffn_size != 4 * cfg.hidden_size:
        raise HFInteropError(f"model.ffn_hidden_size {cfg.ffn_hidden_size}: BLOOM's MLP is "
                             f"4 * hidden_size = {4 * cfg.hidden_size}; set it to 0 or 4h")
    if cfg.hidden_size % cfg.num_heads:
        raise HFInteropError(f"model.num_heads {cfg.num_heads}: does not divide "
                             f"model.hidden_size {cfg.hidden_size}")
    if cfg.position_encoding != "alibi":  # BloomForCausalLM has ALiBi and nothing else
        raise HFInteropError(f"model.position_encoding {cfg.position_encoding!r}: BLOOM "
                             "has ALiBi only")
    return {
        "model_type": "bloom",
        "architectures": ["BloomForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "layer_norm_epsilon": cfg.layernorm_epsilon,
        "initializer_range": cfg.std,
        "hidden_dropout": cfg.hidden_dropout,
        "attention_dropout": cfg.attention_dropout,
        "apply_residual_connection_post_layernorm": False,  # we are pre-LN
        "slow_but_exact": False,
        "pretraining_tp": 1,  # the weights are whole, whatever TP trained them
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        # transformers 4.x reads torch_dtype, 5.x writes and reads dtype
        "torch_dtype": _dtype_name(dtype),
        "dtype": _dtype_name(dtype),
    }


# What each config.json field may hold: a value out of range fails deep inside the model's
# construction (a ZeroDivisionError for n_head 0, a math domain error for a negative width),
# or builds a model that cannot compute (a dropout of 1.5), so it is refused here by name.
_COUNT = Range(ge=1)
_RANGES = {
    "vocab_size": Range(ge=1, le=2**31 - 1),  # token ids are int32 in the data pipeline
    "n_embed": _COUNT, "hidden_size": _COUNT,
    "n_layer": _COUNT, "num_hidden_layers": _COUNT,
    "n_head": _COUNT, "num_attention_heads": _COUNT,
    "layer_norm_epsilon": Range(gt=0),
    "hidden_dropout": Range(ge=0, lt=1), "attention_dropout": Range(ge=0, lt=1),
    "initializer_range": Range(ge=0),
}


def _field(config: Mapping, *names: str, kind: type = int, default=None):
    """The first of ``names`` present in ``config`` (aliases in order), checked for type and
    for its range in ``_RANGES`` (JSON's NaN and Infinity are refused: ``Range`` wants finite
    numbers)."""
    for name in names:
        if config.get(name) is not None:
            value = config[name]
            # bool is an int in Python, and an int is a valid JSON float
            ok = (isinstance(value, bool) if kind is bool else
                  isinstance(value, int) and not isinstance(value, bool) if kind is int else
                  isinstance(value, int | float) and not isinstance(value, bool))
            if not ok:
                raise HFInteropError(f"{name} = {value!r}: expected {kind.__name__}")
            value = kind(value)
            problem = _RANGES[name].problem(value) if name in _RANGES else None
            if problem is not None:
                raise HFInteropError(f"{name} = {value!r}: {problem}")
            return value
    if default is None:
        raise HFInteropError(f"{names[0]}: missing from the BLOOM config")
    return default


def model_config_from_bloom(config: Mapping, base: ModelConfig | None = None) -> ModelConfig:
    """Our ModelConfig from BLOOM config.json fields (the inverse of :func:`bloom_config`).

    Args:
        config: the parsed config.json.
        base: where the fields BLOOM does not record come from (numerics: ``*_fp32``, the
            attention kernel); defaults to ``ModelConfig()``'s. They change how we compute,
            not what the weights are.

    Raises:
        HFInteropError: naming the field that is missing, mistyped, or describes an
            architecture we do not implement.
    """
    if config.get("model_type") != "bloom":
        raise HFInteropError(f"model_type = {config.get('model_type')!r}: only 'bloom' models "
                             "can be imported")
    if _field(config, "apply_residual_connection_post_layernorm", kind=bool, default=False):
        raise HFInteropError("apply_residual_connection_post_layernorm = true: the residual "
                             "taken after the LayerNorm is not implemented (we are pre-LN)")
    if not _field(config, "tie_word_embeddings", kind=bool, default=True):
        raise HFInteropError("tie_word_embeddings = false: our LM head is always tied to "
                             "the word embeddings")
    # slow_but_exact / pretraining_tp only change the summation order of two matmuls in HF
    # (emulating Megatron's TP slices): same model, ignored here.
    # BloomConfig lets the older n_embed win over hidden_size; so do we
    hidden_size = _field(config, "n_embed", "hidden_size")
    initializer_range = _field(config, "initializer_range", kind=float, default=0.02)
    # our default std is a formula of h (init_std = 0); keep it one so the round trip is exact
    default_std = math.sqrt(2.0 / (5.0 * hidden_size))
    fields = dict(
        vocab_size=_field(config, "vocab_size"),
        hidden_size=hidden_size,
        num_layers=_field(config, "n_layer", "num_hidden_layers"),
        num_heads=_field(config, "n_head", "num_attention_heads"),
        ffn_hidden_size=0,  # BLOOM's MLP is always 4h
        layernorm_epsilon=_field(config, "layer_norm_epsilon", kind=float, default=1e-5),
        hidden_dropout=_field(config, "hidden_dropout", kind=float, default=0.0),
        attention_dropout=_field(config, "attention_dropout", kind=float, default=0.0),
        init_std=0.0 if initializer_range == default_std else initializer_range,
    )
    if fields["hidden_size"] % fields["num_heads"]:
        raise HFInteropError(f"n_head {fields['num_heads']}: does not divide hidden_size "
                             f"{fields['hidden_size']}")
    return replace(base or ModelConfig(), **fields)


def read_model_config(directory: str | os.PathLike,
                      base: ModelConfig | None = None) -> ModelConfig:
    """Our ModelConfig from a BLOOM folder's ``config.json`` (see
    :func:`model_config_from_bloom` for ``base``); errors name the file."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        raise UserError(f"{config_path}: not found; a Hugging Face model folder has one")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{config_path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: expected a JSON object")
    try:
        return model_config_from_bloom(config, base)
    except HFInteropError as err:
        raise HFInteropError(f"{config_path}: {err}") from None
