"""Which kind of tokenizer a ``--tokenizer`` value names, and loading it.

=======================================  =====================================================
``--tokenizer``                          kind
=======================================  =====================================================
``PATH.model`` (or a SentencePiece       SentencePiece
model under another name)
``PATH/tokenizer.json``, any ``.json``,  Hugging Face ``tokenizers`` (the Rust library)
or a folder holding a ``tokenizer.json``
``PATH/NAME.tiktoken``                   tiktoken, ranks from the file
``tiktoken:NAME`` or ``NAME``            tiktoken, from its offline cache
=======================================  =====================================================

A folder with only a ``tokenizer.model`` (SentencePiece) is read as that model.
"""

from __future__ import annotations

import os
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import Tokenizer

__all__ = ["load_tokenizer", "tokenizer_kind"]

_KINDS_HELP = ("a SentencePiece .model, a Hugging Face tokenizer.json or a folder with one, a "
               "tiktoken .tiktoken file, or tiktoken:NAME")
# first bytes of a serialized SentencePiece ModelProto: field 1 (pieces), length-delimited
_SENTENCEPIECE_FIRST_BYTE = 0x0A


def tokenizer_kind(spec: str | os.PathLike) -> tuple[str, str]:
    """``(kind, path or name to load)`` of a ``--tokenizer`` value.

    Raises:
        UserError: when it names nothing, or a file of no kind we read.
    """
    from bloomline.dataprep.tokenizer.tiktoken_kind import tiktoken_names

    text = str(spec)
    if not text:
        raise UserError(f"--tokenizer: empty; give {_KINDS_HELP}")
    path = Path(text)
    if text.startswith("tiktoken:"):
        return "tiktoken", text
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return "huggingface", str(path / "tokenizer.json")
        if (path / "tokenizer.model").is_file():
            return "sentencepiece", str(path / "tokenizer.model")
        raise UserError(f"{text}: a folder without tokenizer.json or tokenizer.model")
    if not path.exists():
        if "/" not in text and text in tiktoken_names():
            return "tiktoken", text
        raise UserError(f"{text}: tokenizer not found (expected {_KINDS_HELP})")
    if path.suffix == ".tiktoken":
        return "tiktoken", text
    if path.suffix == ".json":
        return "huggingface", text
    if path.suffix == ".model":
        return "sentencepiece", text
    from bloomline.dataprep.tokenizer.huggingface_kind import looks_like_json

    if looks_like_json(path):
        return "huggingface", text
    try:
        with open(path, "rb") as f:
            first = f.read(1)
    except OSError as err:
        raise UserError(f"{text}: cannot read ({err.strerror})") from None
    if first and first[0] == _SENTENCEPIECE_FIRST_BYTE:
        return "sentencepiece", text
    raise UserError(f"{text}: not a tokenizer file of a kind we read (expected {_KINDS_HELP})")


def load_tokenizer(spec: str | os.PathLike, eod_token: str | None = None) -> Tokenizer:
    """Load the tokenizer that ``spec`` names (see the module docstring for the kinds).

    Args:
        spec: a path or a tiktoken name.
        eod_token: the token that ends documents, when the tokenizer's files do not say (see
            each kind's module for how EOD is found otherwise). Empty means None.

    Raises:
        UserError: one line naming the file and what is wrong with it.
    """
    kind, target = tokenizer_kind(spec)
    eod_token = eod_token or None
    if kind == "sentencepiece":
        from bloomline.dataprep.tokenizer.sentencepiece_kind import SentencePieceTokenizer

        tokenizer: Tokenizer = SentencePieceTokenizer(target, eod_token)
    elif kind == "huggingface":
        from bloomline.dataprep.tokenizer.huggingface_kind import HuggingFaceTokenizer

        tokenizer = HuggingFaceTokenizer(target, eod_token)
    else:
        from bloomline.dataprep.tokenizer.tiktoken_kind import TiktokenTokenizer

        tokenizer = TiktokenTokenizer(target, eod_token)
    tokenizer.spec = str(spec)  # as given, so that workers resolve it the same way
    return tokenizer
