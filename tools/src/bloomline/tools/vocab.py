"""A tokenizer as the tools need it: ids shown as text, with special tokens made visible.

The model is loaded through dataprep's :class:`~bloomline.dataprep.tokenizer.Tokenizer` (its
errors, its EOD id). That wrapper does not expose SentencePiece's piece types, so the model is
opened a second time here to read them once for the whole vocabulary, as boolean arrays that
numpy can index with a whole token array at once.
"""

from __future__ import annotations

import os

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer import Tokenizer

__all__ = ["Vocabulary"]


class Vocabulary:
    """A SentencePiece model with per-id piece types.

    Args:
        model_path: a ``.model`` file.

    Raises:
        UserError: when the file is missing or not a SentencePiece model.
    """

    def __init__(self, model_path: str | os.PathLike) -> None:
        import sentencepiece as spm

        self.tokenizer = Tokenizer(model_path)
        self.model_path = self.tokenizer.model_path
        self.vocab_size = self.tokenizer.vocab_size
        self.eod_id = self.tokenizer.eod_id
        processor = spm.SentencePieceProcessor(model_file=self.model_path)
        ids = list(range(self.vocab_size))  # one batched call per type, not one per id
        self.is_byte = np.array(processor.IsByte(ids), dtype=bool)
        # control pieces (<s>, </s>, <pad>) decode to nothing: shown as markers instead
        self.is_control = np.array(processor.IsControl(ids), dtype=bool)

    def piece(self, token_id: int) -> str:
        """The piece (string) of one id."""
        return self.tokenizer.id_to_piece(token_id)

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
