"""Tokenizers: one interface over SentencePiece, Hugging Face ``tokenizers`` and tiktoken.

- :func:`load_tokenizer` takes what ``--tokenizer`` takes (:data:`TOKENIZER_SPEC_HELP`; the
  kinds are in :mod:`.registry`, recognised by :mod:`.loading`) and returns a
  :class:`Tokenizer`: ``encode_batch`` (numpy ids), ``decode``, ``vocab_size``, ``eod_id``,
  ``special_ids``, ``fingerprint()``.
- :func:`hf_tokenizer_files` is every kind as Hugging Face tokenizer files (``export-hf``).
- :func:`train_tokenizer` trains a SentencePiece model or a BLOOM-style byte-level BPE.
"""

from bloomline.dataprep.tokenizer.base import Tokenizer
from bloomline.dataprep.tokenizer.hf_export import hf_tokenizer_files
from bloomline.dataprep.tokenizer.loading import load_tokenizer, tokenizer_kind
from bloomline.dataprep.tokenizer.registry import KINDS, TOKENIZER_SPEC_HELP
from bloomline.dataprep.tokenizer.training import TOKENIZER_KINDS, train_tokenizer

__all__ = ["KINDS", "TOKENIZER_KINDS", "TOKENIZER_SPEC_HELP", "Tokenizer", "hf_tokenizer_files",
           "load_tokenizer", "tokenizer_kind", "train_tokenizer"]
