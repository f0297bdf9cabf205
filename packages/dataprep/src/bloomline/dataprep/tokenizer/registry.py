"""The tokenizer kinds ``--tokenizer`` reads: name -> class, one line each.

A new kind is a module with a :class:`~.base.Tokenizer` subclass (how it is recognised, how it
encodes, how it becomes a ``tokenizer.json``) and a line here. The order is the order
:func:`~.loading.tokenizer_kind` asks the kinds in where two could claim a value: a folder
holding both a ``tokenizer.json`` and a ``tokenizer.model`` is read as the former, and a file
with no telling suffix is tried as JSON before as a SentencePiece model.
"""

from __future__ import annotations

from bloomline.dataprep.tokenizer.base import Tokenizer
from bloomline.dataprep.tokenizer.huggingface_kind import HuggingFaceTokenizer
from bloomline.dataprep.tokenizer.sentencepiece_kind import SentencePieceTokenizer
from bloomline.dataprep.tokenizer.tiktoken_kind import TiktokenTokenizer

__all__ = ["KINDS", "TOKENIZER_SPEC_HELP"]

KINDS: dict[str, type[Tokenizer]] = {
    "huggingface": HuggingFaceTokenizer,
    "sentencepiece": SentencePieceTokenizer,
    "tiktoken": TiktokenTokenizer,
}

# What every --tokenizer option's help and error says it takes, made from the kinds.
TOKENIZER_SPEC_HELP = "; ".join(kind.spec_help for kind in KINDS.values())
