"""Hugging Face interop: our GPT <-> a ``BloomForCausalLM`` folder (config.json + safetensors).

The model already follows BLOOM name for name and layout for layout (fused QKV per head as
[heads, 3, head_dim], GELU tanh, ALiBi, embedding LayerNorm, tied head), so conversion is a
rename (``transformer.`` prefix) plus a config translation; no tensor is reshaped. Our ALiBi
bias is relative (``slope * (j - i)``) where HF's is absolute (``slope * j``): they differ by
a constant per query row, which the softmax cancels.

HF's ``vocab_size`` is the embedding's row count, i.e. our padded ``ModelConfig.vocab_size``.
BLOOM's config cannot express an MLP width other than 4h, an untied head or the post-LN
residual; those raise :class:`HFInteropError` naming the field.

With the run's tokenizer, the export also holds its files for ``AutoTokenizer`` (every kind as
a ``tokenizer.json``; see :mod:`bloomline.trainer.hf_tokenizer`).
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bloomline.common.atomic import atomic_output_dir, check_replaceable_dir
from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer import Tokenizer
from bloomline.trainer.survival import faults
from bloomline.trainer.hf_tokenizer import hf_tokenizer_files
from bloomline.trainer.model import GPT, ModelConfig

__all__ = ["HFInteropError", "bloom_config", "export_hf", "from_hf_state_dict", "import_hf",
           "model_config_from_bloom", "read_model_config", "to_hf_state_dict"]

_PREFIX = "transformer."
_HEAD = "lm_head.weight"
_EMBEDDING = "word_embeddings.weight"
# what an export folder holds: always, and at most (``--overwrite`` replaces only such a folder)
_EXPORT_REQUIRED = ("config.json", "model.safetensors")
_EXPORT_ALLOWED = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "generation_config.json")
# the weight files transformers writes, in the order it looks for them
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


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


def _field(config: Mapping, *names: str, kind: type = int, default=None):
    """The first of ``names`` present in ``config`` (aliases in order), checked for type."""
    for name in names:
        if config.get(name) is not None:
            value = config[name]
            # bool is an int in Python, and an int is a valid JSON float
            ok = (isinstance(value, bool) if kind is bool else
                  isinstance(value, int) and not isinstance(value, bool) if kind is int else
                  isinstance(value, int | float) and not isinstance(value, bool))
            if not ok:
                raise HFInteropError(f"{name} = {value!r}: expected {kind.__name__}")
            return kind(value)
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


def to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> BloomForCausalLM's (``transformer.`` prefix). ``lm_head.weight`` is left
    out, as transformers' own writer does: it is tied to ``transformer.word_embeddings.weight``
    and the loader re-ties it. Tensors are made contiguous (no copy when they already are)."""
    return {_PREFIX + name: tensor.contiguous() for name, tensor in state_dict.items()}


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BloomForCausalLM's (or BloomModel's, unprefixed) names -> ours.

    ``lm_head.weight`` is dropped: it is optional (tied), and when present must equal the
    embedding, since our head is always tied.

    Raises:
        HFInteropError: when ``lm_head.weight`` differs from the word embeddings.
    """
    out = {name.removeprefix(_PREFIX): tensor.contiguous()
           for name, tensor in hf_state_dict.items() if name != _HEAD}
    head = hf_state_dict.get(_HEAD)
    embedding = out.get(_EMBEDDING)
    if head is not None and embedding is not None and not (
            head.shape == embedding.shape and torch.equal(head, embedding)):
        raise HFInteropError(f"{_HEAD}: differs from {_PREFIX}{_EMBEDDING}; an untied LM head "
                             "is not supported")
    return out


def _check_tensors(state_dict: Mapping[str, torch.Tensor], cfg: ModelConfig, where: str,
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


def export_hf(model_state_dict: Mapping[str, torch.Tensor], cfg: ModelConfig,
              out_dir: str | os.PathLike, dtype: torch.dtype = torch.float32,
              tokenizer: Tokenizer | None = None, overwrite: bool = False, *,
              bos_token_id: int | None = None, eos_token_id: int | None = None,
              pad_token_id: int | None = None) -> Path:
    """Write a folder that ``BloomForCausalLM.from_pretrained`` loads: ``config.json`` and
    ``model.safetensors`` (the tied weight once, as ``transformer.word_embeddings.weight``);
    with ``tokenizer``, also the files ``AutoTokenizer.from_pretrained`` loads with the same
    ids (``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``; see
    :func:`~bloomline.trainer.hf_tokenizer.hf_tokenizer_files`).

    The folder is built in a hidden sibling ``.NAME.*.partial`` folder and renamed into place
    when complete, so a crash never leaves a folder that looks like a finished export, and a
    failure (a full disk) or Ctrl-C removes it. ``overwrite`` replaces only an earlier
    export: a folder of ``config.json`` + ``model.safetensors`` and the tokenizer files, and
    nothing else (``bloomline.common.atomic.check_replaceable_dir``): not a run folder, a
    checkpoint or any folder with other files in it.

    Args:
        model_state_dict: our model's full (unsharded) state dict, on any device.
        cfg: its config.
        out_dir: the folder to create; an existing empty folder is fine.
        dtype: the saved weights' dtype (float32, bfloat16, float16).
        tokenizer: the run's tokenizer (any kind), or None for no tokenizer files.
        overwrite: replace an existing export at ``out_dir`` (see above).
        bos_token_id, eos_token_id, pad_token_id: written to config.json; by default the
            tokenizer's (``special_ids`` bos, eod, pad), else none.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        UserError: an existing output without ``overwrite`` (or one that is not an export),
            a tokenizer that is not the model's or cannot be converted, or (HFInteropError)
            a config BLOOM cannot express or tensors that do not fit it.
    """
    out_dir = Path(out_dir)
    check_replaceable_dir(out_dir, overwrite, "transformers export", _EXPORT_REQUIRED,
                          _EXPORT_ALLOWED)
    # validate and convert everything before writing anything
    tokenizer_files: dict[str, bytes] = {}
    if tokenizer is not None:
        special = tokenizer.special_ids
        bos_token_id = special.get("bos") if bos_token_id is None else bos_token_id
        eos_token_id = special.get("eod") if eos_token_id is None else eos_token_id
        pad_token_id = special.get("pad") if pad_token_id is None else pad_token_id
    config = bloom_config(cfg, dtype=dtype, bos_token_id=bos_token_id,
                          eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    _check_tensors(model_state_dict, cfg, "model state dict", lambda name: name)
    if tokenizer is not None:
        tokenizer_files = hf_tokenizer_files(tokenizer, cfg.vocab_size)
    tensors = to_hf_state_dict({name: t.detach().to(device="cpu", dtype=dtype)
                                for name, t in model_state_dict.items()})
    with atomic_output_dir(out_dir.parent, prefix=out_dir.name) as scratch:
        # a plain mkdir inside the (0700) scratch folder gives the export ordinary permissions
        staged = scratch / "export"
        staged.mkdir()
        save_file(tensors, staged / "model.safetensors", metadata={"format": "pt"})
        faults.fire("export")
        (staged / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name, content in tokenizer_files.items():
            (staged / name).write_bytes(content)
        if out_dir.exists():
            # os.replace cannot replace a non-empty folder: move the old one into the scratch
            # folder, which is deleted on exit (and back, should the new one not move in)
            os.replace(out_dir, scratch / "replaced")
            try:
                os.replace(staged, out_dir)
            except BaseException:
                os.replace(scratch / "replaced", out_dir)
                raise
        else:
            os.replace(staged, out_dir)
    return out_dir


def _load_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"{path}: weight file not found")
    try:
        if path.suffix == ".safetensors":
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise UserError(f"{path}: cannot read weights: {str(err).splitlines()[0]}") from None


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of the first weight file (or sharded index) found, and which it was."""
    for name in _WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return _load_weight_file(path), path
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(f"{path}: not a sharded-checkpoint index ({err})") from None
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_load_weight_file(directory / shard))
        return tensors, path
    raise UserError(f"{directory}: no weights found (looked for {', '.join(_WEIGHT_FILES)})")


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


def import_hf(directory: str | os.PathLike,
              base: ModelConfig | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our config and fp32 state dict from a BLOOM folder (``config.json`` and
    ``model.safetensors``, a sharded ``model.safetensors.index.json``, or
    ``pytorch_model.bin``), ready for ``GPT(cfg).load_state_dict``.

    Args:
        directory: the HF model folder (ours from :func:`export_hf`, or any BLOOM one).
        base: supplies the fields BLOOM's config does not record (see
            :func:`model_config_from_bloom`).

    Raises:
        UserError: one line naming the file and the field or tensor at fault.
    """
    directory = Path(directory)
    cfg = read_model_config(directory, base)
    hf_state_dict, source = _read_weights(directory)
    try:
        state_dict = from_hf_state_dict(hf_state_dict)
    except HFInteropError as err:
        raise HFInteropError(f"{source}: {err}") from None
    _check_tensors(state_dict, cfg, str(source), lambda name: _PREFIX + name)
    return cfg, {name: t.float() for name, t in state_dict.items()}
