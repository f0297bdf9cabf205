"""Loading a BLOOM folder (ours from ``export_hf`` or any transformers one) as our config and
state dict: ``checkpoint.init_from`` pointing at a Hugging Face model."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from bloomline.common.errors import UserError
from bloomline.trainer.hf.bloom_config import HFInteropError, read_model_config
from bloomline.trainer.hf.bloom_names import PREFIX, check_tensors, from_hf_state_dict
from bloomline.trainer.model import ModelConfig

__all__ = ["import_hf"]

# the weight files transformers writes, in the order it looks for them
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


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
    check_tensors(state_dict, cfg, str(source), lambda name: PREFIX + name)
    return cfg, {name: t.float() for name, t in state_dict.items()}
