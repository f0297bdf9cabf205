"""``trainer export-hf``: a folder ``BloomForCausalLM.from_pretrained`` (and, with the run's
tokenizer, ``AutoTokenizer``) loads, written whole or not at all."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from bloomline.common import faults
from bloomline.common.atomic import atomic_output_dir, check_replaceable_dir, publish
from bloomline.dataprep.tokenizer import Tokenizer, hf_tokenizer_files
from bloomline.trainer.hf.bloom_config import bloom_config
from bloomline.trainer.hf.bloom_names import check_tensors, to_hf_state_dict
from bloomline.trainer.model import ModelConfig

__all__ = ["export_hf"]

# what an export folder holds: always, and at most (``--overwrite`` replaces only such a folder)
_EXPORT_REQUIRED = ("config.json", "model.safetensors")
_EXPORT_ALLOWED = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "generation_config.json")


def export_hf(model_state_dict: Mapping[str, torch.Tensor], cfg: ModelConfig,
              out_dir: str | os.PathLike, dtype: torch.dtype = torch.float32,
              tokenizer: Tokenizer | None = None, overwrite: bool = False, *,
              bos_token_id: int | None = None, eos_token_id: int | None = None,
              pad_token_id: int | None = None) -> Path:
    """Write a folder that ``BloomForCausalLM.from_pretrained`` loads: ``config.json`` and
    ``model.safetensors`` (the tied weight once, as ``transformer.word_embeddings.weight``);
    with ``tokenizer``, also the files ``AutoTokenizer.from_pretrained`` loads with the same
    ids (``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``; see
    :func:`~bloomline.dataprep.tokenizer.hf_tokenizer_files`).

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
    check_tensors(model_state_dict, cfg, "model state dict", lambda name: name)
    if tokenizer is not None:
        tokenizer_files = hf_tokenizer_files(tokenizer, cfg.vocab_size)
    tensors = to_hf_state_dict({name: t.detach().to(device="cpu", dtype=dtype)
                                for name, t in model_state_dict.items()})
    with atomic_output_dir(out_dir.parent, prefix=out_dir.name) as scratch:
        # a plain mkdir inside the (0700) scratch folder gives the export ordinary permissions
        staged = scratch / "export"
        staged.mkdir()
        # safetensors writes through a private (0600) temporary file of its own: publish
        # gives the file the mode the others get from a plain open() under the umask
        save_file(tensors, staged / ".model.safetensors.partial", metadata={"format": "pt"})
        publish(staged / ".model.safetensors.partial", staged / "model.safetensors")
        faults.fire("export")  # a fault point of survival/faults.py's list
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
