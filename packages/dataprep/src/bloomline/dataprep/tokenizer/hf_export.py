"""The tokenizer files of a Hugging Face export, so that ``AutoTokenizer.from_pretrained(OUT)``
gives the ids our :class:`~bloomline.dataprep.tokenizer.Tokenizer` gives.

Every kind becomes a ``tokenizer.json`` (what ``PreTrainedTokenizerFast`` / transformers 5's
``TokenizersBackend`` run as is; each kind's :meth:`~.base.Tokenizer.to_tokenizer_json`)
beside a ``tokenizer_config.json`` naming the special tokens:

- ``huggingface``: the run's ``tokenizer.json``, re-serialized without padding or truncation
  (our encode never pads or truncates; the tokenizers library applies what the file says).
- ``sentencepiece``: converted from the model proto (:mod:`.sentencepiece_convert`); the
  original ``.model`` is shipped too, as ``tokenizer.model``.
- ``tiktoken``: converted from the ranks (:mod:`.tiktoken_convert`).

No torch and no transformers here: the trainer's ``export-hf`` calls
:func:`hf_tokenizer_files` and writes the files beside the model's.

SentencePiece and tiktoken read text that spells a special token (``</s>``,
``<|endoftext|>``) as text; ``split_special_tokens`` tells transformers to do the same.
A ``tokenizer.json`` reads them as the special token, and so does its export.

``generation_config.json`` carries the special ids and suppresses the ids no token has: those
past the tokenizer's vocabulary (the embedding is padded to a multiple of 128) and the gaps
inside it (added tokens above the base vocabulary), as ``trainer generate`` does, so that a
greedy ``generate`` in transformers continues a prompt as ours does. The ``tokenizer.json``
keeps every token at its id, added tokens above the base vocabulary included.
"""

from __future__ import annotations

import json

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import Tokenizer

__all__ = ["hf_tokenizer_files", "tokenizer_json"]

# transformers' names of our special-token roles
_CONFIG_KEYS = {"bos": "bos_token", "eod": "eos_token", "pad": "pad_token", "unk": "unk_token"}
# ALiBi has no position table: the model runs past its training length, so the tokenizer sets
# no limit (transformers would warn, wrongly, about "indexing errors" past one)
_NO_LENGTH_LIMIT = 1_000_000_000


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """The ``tokenizer.json`` text that encodes as ``tokenizer`` does (see the module docstring).

    Raises:
        UserError: a kind without an export, a SentencePiece model with a feature
            ``tokenizers`` cannot reproduce, or tiktoken ranks that take a special token's id.
    """
    return tokenizer.to_tokenizer_json()


def _tokenizer_config(tokenizer: Tokenizer) -> dict:
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for role, key in _CONFIG_KEYS.items():
        if role in tokenizer.special_ids:
            config[key] = tokenizer.id_to_piece(tokenizer.special_ids[role])
    config.update({
        "model_max_length": _NO_LENGTH_LIMIT,
        # decode must give the text back as ours does, not tidy " ." into "."
        "clean_up_tokenization_spaces": False,
        # batched generate pads on the left, as BLOOM's own tokenizer does
        "padding_side": "left",
        "split_special_tokens": tokenizer.specials_read_as_text,
    })
    # no add_bos_token / add_eos_token: BOS and EOS come from the tokenizer.json's
    # post-processor (a Llama 3 file's <|begin_of_text|>), as in our encode, not from flags
    # that transformers may turn into a template of its own
    return config


def _generation_config(tokenizer: Tokenizer, model_vocab_size: int) -> dict:
    return {
        "bos_token_id": tokenizer.special_ids.get("bos"),
        "eos_token_id": tokenizer.special_ids.get("eod"),
        "pad_token_id": tokenizer.special_ids.get("pad"),
        # rows of the padded embedding that no token owns: never generated (as ours)
        "suppress_tokens": (tokenizer.unassigned_ids()
                            + list(range(tokenizer.vocab_size, model_vocab_size))) or None,
    }


def hf_tokenizer_files(tokenizer: Tokenizer, model_vocab_size: int) -> dict[str, bytes]:
    """File name -> contents of the tokenizer files of an export, built in memory so that a
    tokenizer that cannot be converted fails before anything is written.

    Args:
        tokenizer: the run's tokenizer.
        model_vocab_size: the model's embedding rows (``ModelConfig.vocab_size``, padded).

    Raises:
        UserError: a tokenizer with more ids than the model has rows, or one that cannot be
            converted (see :func:`tokenizer_json`).
    """
    if tokenizer.vocab_size > model_vocab_size:
        raise UserError(f"{tokenizer.spec}: the tokenizer has {tokenizer.vocab_size} ids, the "
                        f"model's embedding {model_vocab_size} rows; it is not this model's "
                        "tokenizer")
    files = {
        "tokenizer.json": tokenizer_json(tokenizer).encode("utf-8"),
        "tokenizer_config.json": _json_bytes(_tokenizer_config(tokenizer)),
        "generation_config.json": _json_bytes(_generation_config(tokenizer, model_vocab_size)),
    }
    # the kind's own files (a SentencePiece tokenizer.model); the tokenizer.json beside them
    # is what AutoTokenizer and our --tokenizer OUT read
    files.update(tokenizer.export_files())
    return files


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
