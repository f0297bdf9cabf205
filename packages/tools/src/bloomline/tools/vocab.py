"""A tokenizer as the tools need it: ids shown as text, with special tokens made visible.

Any tokenizer ``dataprep`` reads (SentencePiece, Hugging Face ``tokenizer.json``, tiktoken) is
loaded through :func:`~bloomline.dataprep.tokenizer.load_tokenizer` (its errors, its EOD id).
Which ids are control tokens or byte-fallback pieces is read once for the whole vocabulary,
as boolean arrays that numpy can index with a whole token array at once.
"""

from __future__ import annotations

import os
import re

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer import load_tokenizer

__all__ = ["Vocabulary", "readable_bytes"]

# bytes that are no whole UTF-8 character, as surrogateescape leaves them: U+DC80..U+DCFF
_LONE_BYTES = re.compile("[\udc80-\udcff]+")


def readable_bytes(data: bytes) -> str:
    """UTF-8 text, with the bytes that form no whole character (a byte-level piece may end
    inside one) written ``<e7 9a>``: ``b" \\xe7\\x9a"`` -> ``" <e7 9a>"``."""
    text = data.decode("utf-8", errors="surrogateescape")
    return _LONE_BYTES.sub(
        lambda run: "<" + " ".join(f"{ord(c) - 0xDC00:02x}" for c in run.group()) + ">", text)


class Vocabulary:
    """A tokenizer with per-id flags (control token, byte-fallback piece).

    Args:
        model_path: what ``--tokenizer`` takes
            (:data:`~bloomline.dataprep.tokenizer.TOKENIZER_SPEC_HELP`).

    Raises:
        UserError: when it names no tokenizer we read.
    """

    def __init__(self, model_path: str | os.PathLike) -> None:
        self.tokenizer = load_tokenizer(model_path)
        self.model_path = self.tokenizer.spec
        # the largest id + 1: added tokens may sit above the base vocabulary, with gaps
        self.vocab_size = self.tokenizer.vocab_size
        self.unassigned_ids = self.tokenizer.unassigned_ids()
        self.eod_id = self.tokenizer.special_ids.get("eod")
        self.is_byte = np.zeros(self.vocab_size, dtype=bool)
        self.is_byte[self.tokenizer.byte_ids()] = True
        # control tokens (<s>, </s>, <pad>) decode to nothing: shown as markers instead
        self.is_control = np.zeros(self.vocab_size, dtype=bool)
        self.is_control[self.tokenizer.control_ids()] = True

    def piece(self, token_id: int) -> str:
        """The piece (string) of one id."""
        return self.tokenizer.id_to_piece(token_id)

    def piece_text(self, token_id: int) -> str:
        """What one id reads as (``Ġthe`` -> ``" the"``, ``çļĦ`` -> ``"的"``, a byte piece
        or part of a character -> ``"<e7 9a>"``); a control token as ``⟦</s>⟧``."""
        if self.is_control[token_id]:
            return f"⟦{self.piece(token_id)}⟧"
        spelled = self.tokenizer.token_bytes(token_id)
        return "" if spelled is None else readable_bytes(spelled)

    def check_ids(self, ids: np.ndarray, where: str) -> None:
        """Refuse ids this vocabulary cannot decode (wrong ``--tokenizer`` for the file).

        Raises:
            UserError: naming ``where`` (the file or sample) and the first bad id.
        """
        ids = np.asarray(ids)
        outside = (ids < 0) | (ids >= self.vocab_size)
        if outside.any():
            first = int(np.flatnonzero(outside)[0])
            raise UserError(f"{where}: token id {int(ids[first])} at position {first} is not "
                            f"below the vocabulary size {self.vocab_size} of {self.model_path}; "
                            "wrong --tokenizer?")

    def render(self, ids: np.ndarray) -> str:
        """Text of ``ids``; control tokens (EOD, BOS, PAD) appear as ``⟦</s>⟧``, not dropped.

        Call :meth:`check_ids` first. The runs between control tokens are decoded whole,
        so multi-byte characters split over byte-fallback pieces come out intact.
        """
        ids = np.asarray(ids, dtype=np.int64)
        parts: list[str] = []
        previous = 0
        # one loop step per control token (a few per document), not per token
        for position in np.flatnonzero(self.is_control[ids]).tolist():
            parts.append(self.tokenizer.decode(ids[previous:position]))
            parts.append(f"⟦{self.piece(int(ids[position]))}⟧")
            previous = position + 1
        parts.append(self.tokenizer.decode(ids[previous:]))
        return "".join(parts)
