"""Loading a BLOOM folder (ours from ``export_hf`` or any transformers one) as our config and
state dict: ``checkpoint.init_from`` pointing at a Hugging Face model.

A folder is input the user may have downloaded from anywhere, so everything in it is checked
before it is used: the config's ranges (``bloom_config``), its size against the weight files
and this machine's memory before anything is allocated (``check_model_size``), the index's
shard names (plain file names in the folder: a path would read a file from elsewhere), what a
``pytorch_model.bin`` unpickles to (through torch's restricted ``weights_only`` loader), and
that every tensor is finite (NaN weights would start a run that skips every step).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import require_regular_file
from bloomline.common.machine import format_bytes, memory_limit
from bloomline.trainer.hf.bloom_config import HFInteropError, read_model_config
from bloomline.trainer.hf.bloom_names import PREFIX, check_tensors, from_hf_state_dict
from bloomline.trainer.model import ModelConfig

__all__ = ["check_model_size", "import_hf", "weight_files"]

# the weight files transformers writes, in the order it looks for them
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
# the fewest bytes a stored weight takes (an 8-bit float); a config describing more
# parameters than its weight files can hold at that size describes another model
_MIN_BYTES_PER_WEIGHT = 1
# import_hf returns the whole model in fp32 on the CPU, in every process that loads it
_LOADED_BYTES_PER_WEIGHT = 4
_GIB = 2**30


def _shard_names(index: Path) -> list[str]:
    """The distinct shard files a sharded-checkpoint index names, each a plain file name in
    the index's folder: a name with a separator, ``..`` or an absolute path would load a file
    from another folder (``Path / "/abs"`` is ``/abs``)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{index}: not a sharded-checkpoint index ({err}); it needs a "
                        "\"weight_map\" object of tensor name -> shard file") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index}: weight_map is {type(weight_map).__name__} "
                        f"{json.dumps(weight_map)[:60]}; expected a non-empty object of "
                        "tensor name -> shard file")
    names = set()
    for tensor, shard in weight_map.items():
        if not (isinstance(shard, str) and shard not in ("", ".", "..")
                and "/" not in shard and "\\" not in shard and not os.path.isabs(shard)):
            raise UserError(f"{index}: weight_map[{tensor!r}] = {shard!r}: a shard must be a "
                            "file name in the model's folder (no path)")
        names.add(shard)
    return sorted(names)


def weight_files(directory: str | os.PathLike) -> tuple[Path, list[Path]]:
    """The first weight file (or sharded index) of a BLOOM folder, in transformers' order,
    and the files holding its tensors (the index's shards, each checked to be a regular file
    of the folder). Raises a one-line UserError when there is none or the index is bad."""
    directory = Path(directory)
    for name in _WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return path, [path]
        return path, [require_regular_file(directory / shard, f"weight shard of {path.name}")
                      for shard in _shard_names(path)]
    raise UserError(f"{directory}: no weights found (looked for {', '.join(_WEIGHT_FILES)})")


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{n:.2e}"


def check_model_size(directory: str | os.PathLike, cfg: ModelConfig) -> None:
    """Before anything is allocated: the model ``config.json`` describes must be one its
    weight files can hold, and loading it (fp32, whole, on the CPU) must fit in this
    machine's memory. One-line UserError naming the sizes otherwise."""
    directory = Path(directory)
    params = cfg.num_parameters()
    source, files = weight_files(directory)
    stored = sum(path.stat().st_size for path in files)
    if params * _MIN_BYTES_PER_WEIGHT > stored:
        raise HFInteropError(
            f"{directory / 'config.json'}: describes {_count(params)} parameters (vocab_size "
            f"{cfg.vocab_size}, hidden_size {cfg.hidden_size}, n_layer {cfg.num_layers}), more "
            f"than {source.name}'s {format_bytes(stored)} of weights can hold; the config is not "
            "this model's")
    needed = params * _LOADED_BYTES_PER_WEIGHT
    memory = memory_limit()
    if memory is not None and needed > memory:
        raise UserError(
            f"{directory}: loading its {_count(params)}-parameter model needs "
            f"{format_bytes(needed)} (fp32, whole, in every process), more than this "
            f"machine's {format_bytes(memory)} of memory; start from it on a machine with more "
            "memory")


def _load_weight_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one weight file, each checked to be a finite floating-point tensor."""
    require_regular_file(path, "weight file")
    try:
        if path.suffix == ".safetensors":
            tensors = load_file(path)
        else:
            # weights_only: torch's restricted unpickler (tensors and containers, no code)
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except SafetensorError as err:
        raise UserError(f"{path}: cannot read weights: {str(err).splitlines()[0]}") from None
    except pickle.UnpicklingError as err:
        # torch's message is a page of advice to turn weights_only off; keep its reason only
        reason = re.search(r"WeightsUnpickler error: (.*)", str(err))
        reason = reason.group(1).split(". ")[0] if reason else "refused"
        raise UserError(f"{path}: holds more than tensors (torch's weights-only loader: "
                        f"{reason}); expected a state dict saved by torch.save") from None
    except Exception as err:  # noqa: BLE001 - torch.load of a foreign file fails many ways
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{path}: cannot read weights ({type(err).__name__}: {first[:200]}); "
                        "expected a state dict saved by torch.save") from None
    if not isinstance(tensors, Mapping):
        raise UserError(f"{path}: holds a {type(tensors).__name__}, not a state dict (a dict "
                        "of tensor name -> tensor)")
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise UserError(f"{path}: entry {name!r} is a {type(tensor).__name__}, not a "
                            "tensor; a state dict maps tensor names to tensors")
        if not tensor.is_floating_point():
            raise UserError(f"{path}: {name} is {str(tensor.dtype).removeprefix('torch.')}; "
                            "model weights are floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise UserError(f"{path}: {name} holds NaN or inf values; a model to start from "
                            "must be finite (export it again from a good checkpoint)")
    return dict(tensors)


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of the first weight file (or sharded index) found, and which it was."""
    source, files = weight_files(directory)
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(_load_weight_file(path))
    return tensors, source


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
    check_model_size(directory, cfg)
    hf_state_dict, source = _read_weights(directory)
    try:
        state_dict = from_hf_state_dict(hf_state_dict)
    except HFInteropError as err:
        raise HFInteropError(f"{source}: {err}") from None
    check_tensors(state_dict, cfg, str(source), lambda name: PREFIX + name)
    return cfg, {name: t.float() for name, t in state_dict.items()}
