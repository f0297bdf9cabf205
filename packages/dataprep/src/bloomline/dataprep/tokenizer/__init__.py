"""Tokenizers: one interface over SentencePiece, Hugging Face ``tokenizers`` and tiktoken.

- :func:`load_tokenizer` takes what ``--tokenizer`` takes (see :mod:`.loading` for the kinds)
  and returns a :class:`Tokenizer`: ``encode_batch`` (numpy ids), ``decode``, ``vocab_size``,
  ``eod_id``, ``special_ids``, ``fingerprint()``.
- :func:`train_tokenizer` trains a SentencePiece model or a BLOOM-style byte-level BPE.
"""

from bloomline.dataprep.tokenizer.base import Tokenizer
from bloomline.dataprep.tokenizer.loading import load_tokenizer, tokenizer_kind
from bloomline.dataprep.tokenizer.training import TOKENIZER_KINDS, train_tokenizer

__all__ = ["TOKENIZER_KINDS", "Tokenizer", "load_tokenizer", "tokenizer_kind",
           "train_tokenizer"]
