"""A run's own copy of its tokenizer, so that a run folder or a checkpoint is usable wherever
it is copied, as transformers keeps a model's tokenizer files beside its weights.

Contract:

- ``tokenizer/`` in the run folder (written at start) and in every checkpoint (written with
  it, listed in its manifest) holds the file ``data.tokenizer`` names, byte for byte and under
  its own name (``demo.model``; the ``tokenizer.json`` of a folder) with, for a Hugging Face
  file, the ``tokenizer_config.json`` beside it (where its EOD token may be named), and, when
  it is not a Hugging Face file already, its ``tokenizer.json`` export (what
  ``AutoTokenizer`` and ``--tokenizer`` read) when the kind converts.
- Why in each checkpoint rather than a reference to the run folder's copy: a checkpoint is
  what gets copied on its own (to another machine, a model store) and what retention deletes
  or keeps; a relative link out of it would break on the first copy. The files are small
  beside the weights (a 250k-entry tokenizer is a few MB).
- ``tiktoken:NAME`` is a published encoding, not a file of the run: nothing is copied.
- Reading it back (:func:`inference_tokenizer`): ``generate``, ``export-hf`` (and anything
  else that loads a checkpoint's tokenizer) use the checkpoint's copy whenever it has one,
  the original file otherwise (checkpoints written before copies existed); ``--tokenizer``
  overrides both. Always the copy, not only when the original is gone: it is the tokenizer
  the weights were trained with, while the original path may since hold another file. The
  saved ``config.toml`` keeps the original path, for the record.
"""

from __future__ import annotations

import functools
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer import load_tokenizer, tokenizer_kind
from bloomline.dataprep.tokenizer.hf_export import tokenizer_json

__all__ = ["EXPORT_NAME", "TOKENIZER_DIR", "copied_tokenizer", "inference_tokenizer",
           "tokenizer_copy_files"]

TOKENIZER_DIR = "tokenizer"
EXPORT_NAME = "tokenizer.json"
# read beside a Hugging Face tokenizer file (its eos_token), never loaded as the tokenizer
_COMPANION = "tokenizer_config.json"


def tokenizer_copy_files(data) -> dict[str, bytes]:
    """``{"tokenizer/NAME": contents}`` of the copy of ``data.tokenizer`` (a ``DataConfig``);
    empty without a tokenizer or for a ``tiktoken:NAME``. Read (and converted) once per
    process and tokenizer: every checkpoint of the run holds the same files.

    Raises:
        UserError: the tokenizer no longer exists or is no tokenizer (named as ``data.tokenizer``).
    """
    if not data.tokenizer:
        return {}
    try:
        return dict(_copy_files(data.tokenizer, data.eod_token or None))
    except UserError as err:
        raise UserError(f"data.tokenizer: {err}") from None


@functools.lru_cache(maxsize=2)
def _copy_files(spec: str, eod_token: str | None) -> tuple[tuple[str, bytes], ...]:
    kind, target = tokenizer_kind(spec)
    path = Path(target)
    if not path.is_file():
        return ()
    files = {f"{TOKENIZER_DIR}/{path.name}": path.read_bytes()}
    companion = path.parent / _COMPANION
    if kind == "huggingface" and companion.is_file():
        files[f"{TOKENIZER_DIR}/{_COMPANION}"] = companion.read_bytes()
    if kind != "huggingface" and path.name != EXPORT_NAME:
        try:
            export = tokenizer_json(load_tokenizer(target, eod_token))
        except UserError:
            export = None  # a kind feature tokenizers lacks: export-hf names it when asked
        if export is not None:
            files[f"{TOKENIZER_DIR}/{EXPORT_NAME}"] = export.encode("utf-8")
    return tuple(files.items())


def copied_tokenizer(folder: str | Path) -> Path | None:
    """The tokenizer file a checkpoint (or run folder) holds a copy of: the original's copy,
    not the export or the companion beside it (the export when the original is a
    ``tokenizer.json``); None without a copy."""
    copy = Path(folder) / TOKENIZER_DIR
    if not copy.is_dir():
        return None
    files = sorted(path for path in copy.iterdir()
                   if path.is_file() and path.name != _COMPANION)
    originals = [path for path in files if path.name != EXPORT_NAME]
    return (originals or files or [None])[0]


def inference_tokenizer(checkpoint: str | Path, saved: str, given: str | None = None) -> str:
    """The tokenizer to load for ``checkpoint`` (see the module docstring for the rule):
    ``given`` (``--tokenizer``), else the checkpoint's copy, else ``saved`` (its config's
    ``data.tokenizer``; may be empty)."""
    if given:
        return given
    copy = copied_tokenizer(checkpoint)
    return str(copy) if copy is not None else saved
