"""The one tokenizer interface the data pipeline, the trainer and the tools use.

Every kind (SentencePiece, Hugging Face ``tokenizers``, tiktoken) answers the same few
questions: ids of a batch of texts as numpy arrays, text of ids, the vocabulary size, the
end-of-document id (EOD), the ids of the other special tokens, and a fingerprint of the
vocabulary that token files record beside them (see :mod:`bloomline.dataprep.fingerprint`).

EOD follows Megatron's tokenizers: ``eod`` is the model's end-of-sequence token. Each kind
says how it finds it (see its module); ``eod_token`` names it when the files do not.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.indexed_dataset import token_dtype_for_vocab

__all__ = ["Tokenizer"]


class Tokenizer(ABC):
    """A loaded tokenizer. Make one with :func:`~bloomline.dataprep.tokenizer.load_tokenizer`.

    Attributes:
        kind: ``"sentencepiece"``, ``"huggingface"`` or ``"tiktoken"``.
        spec: what was given to load it (a path or a tiktoken name); with ``eod_token``
            enough to load it again (worker processes do).
        eod_token: the end-of-document token named by the user, or None (found by the kind).
        vocab_size: ids are ``0 .. vocab_size - 1``.
        special_ids: role (``eod``, ``bos``, ``pad``, ``unk``) -> id, for the roles this
            tokenizer has. ``eod`` may be absent: then :attr:`eod_id` raises.
    """

    kind: str = ""

    def __init__(self, spec: str, eod_token: str | None) -> None:
        self.spec = spec
        self.eod_token = eod_token
        self.vocab_size = 0
        self.special_ids: dict[str, int] = {}
        self._fingerprint: str | None = None

    # -- what every kind provides ---------------------------------------------------------
    @abstractmethod
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (one integer array per text), on the calling thread only:
        parallelism comes from worker processes, which scale across cores without fighting
        over a library's own thread pool."""

    @abstractmethod
    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of token ids (special tokens dropped)."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry of one id, as the library spells it (``▁the``, ``Ġthe``)."""

    @abstractmethod
    def _vocabulary_entries(self) -> Iterable[bytes]:
        """Every id's entry in id order, as bytes: what the fingerprint hashes."""

    def control_ids(self) -> list[int]:
        """Ids that decode to nothing (EOD, BOS, PAD, other special tokens)."""
        return sorted(set(self.special_ids.values()))

    def byte_ids(self) -> list[int]:
        """Ids of byte-fallback pieces (``<0xAB>``): text the vocabulary had no piece for."""
        return []

    # -- derived ----------------------------------------------------------------------------
    @property
    def eod_id(self) -> int:
        """The end-of-document id appended after each document.

        Raises:
            UserError: when the tokenizer has no end-of-text token and none was named.
        """
        if "eod" not in self.special_ids:
            raise UserError(f"{self.spec}: the tokenizer has no end-of-text token to end "
                            f"documents with{self._eod_hint()}; name one with --eod-token "
                            "TOKEN (data.eod_token in the trainer), or pass --no-append-eod")
        return self.special_ids["eod"]

    @property
    def has_eod(self) -> bool:
        """Whether an end-of-document id is known."""
        return "eod" in self.special_ids

    def _eod_hint(self) -> str:
        return ""

    @property
    def pad_id(self) -> int | None:
        """The padding id, or None."""
        return self.special_ids.get("pad")

    @property
    def token_dtype(self) -> np.dtype:
        """The ``.bin`` dtype for this vocabulary (Megatron's rule: uint16 below 65,500)."""
        return token_dtype_for_vocab(self.vocab_size)

    @property
    def name(self) -> str:
        """A short name for messages and metadata: the file name or the encoding name."""
        return self.spec.rstrip("/").rsplit("/", 1)[-1]

    def fingerprint(self) -> str:
        """sha256 of the kind and every id's vocabulary entry, in id order.

        Two tokenizers with the same fingerprint give ids the same meaning, whatever their
        files look like (a re-saved ``tokenizer.json``, a copied ``.model``): this is what a
        corpus and a run must agree on. Computed once (~0.2 s for 250k entries).
        """
        if self._fingerprint is None:
            digest = hashlib.sha256(self.kind.encode() + b"\0")
            for entry in self._vocabulary_entries():
                digest.update(len(entry).to_bytes(4, "little"))
                digest.update(entry)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def describe(self) -> dict:
        """What token files record about the tokenizer that made them."""
        return {"kind": self.kind, "name": self.name, "vocab_size": self.vocab_size,
                "eod_id": self.special_ids.get("eod"), "vocab_sha256": self.fingerprint()}

    # Worker processes get the spec and load the tokenizer themselves: shipping a 250k-entry
    # vocabulary (or a Rust object that cannot be pickled) through a pipe would be slower.
    def __getstate__(self) -> dict:
        return {"spec": self.spec, "eod_token": self.eod_token}

    def __setstate__(self, state: dict) -> None:
        from bloomline.dataprep.tokenizer.loading import load_tokenizer

        self.__dict__.update(load_tokenizer(state["spec"], state["eod_token"]).__dict__)

    def __repr__(self) -> str:
        return f"<{self.kind} tokenizer {self.spec} vocab={self.vocab_size}>"
