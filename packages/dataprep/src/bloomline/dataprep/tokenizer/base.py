"""The one tokenizer interface the data pipeline, the trainer and the tools use.

Every kind (SentencePiece, Hugging Face ``tokenizers``, tiktoken) answers the same few
questions: ids of a batch of texts as numpy arrays, text of ids, the vocabulary size, the
end-of-document id (EOD), the ids of the other special tokens, and a fingerprint of the
vocabulary that token files record beside them (see :mod:`bloomline.dataprep.fingerprint`).

The vocabulary size is the largest id + 1, never the number of entries: a ``tokenizer.json``
may put its added tokens above its base vocabulary with ids unused between (GPT-4o's o200k
has 200,000 entries and ``<|endofprompt|>`` at 200018), and tiktoken's ranks may leave gaps.
Everything indexed by id (embedding rows, per-id arrays) and every range check needs the
id space; :meth:`Tokenizer.unassigned_ids` names the ids inside it that no token has.

EOD follows Megatron's tokenizers: ``eod`` is the model's end-of-sequence token. Each kind
says how it finds it (see its module); ``eod_token`` names it when the files do not.

A kind is one module holding a subclass, plus one line in :mod:`.registry`. The subclass says
how a ``--tokenizer`` value is recognised as its kind (the class attributes and class methods
under "recognising a kind", read by :mod:`.loading`) and how it becomes a Hugging Face
``tokenizer.json`` (:meth:`Tokenizer.to_tokenizer_json`, read by :mod:`.hf_export`).
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.indexed_dataset import token_dtype_for_vocab

__all__ = ["MAX_TOKEN_ID", "Tokenizer"]

# how byte-fallback pieces are spelled (SentencePiece's, Llama 2's tokenizer.json): <0xE7>
_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
# SentencePiece's (and Metaspace's) sign for a space
_SPACE_SIGN = "\u2581"

# The largest id a token file holds: ``.bin`` files of a large vocabulary are int32 (Megatron's
# format). A tokenizer with a larger id would have it wrapped into another token's id.
MAX_TOKEN_ID = 2**31 - 1


class Tokenizer(ABC):
    """A loaded tokenizer. Make one with :func:`~bloomline.dataprep.tokenizer.load_tokenizer`.

    Attributes:
        kind: the kind's name in :data:`~bloomline.dataprep.tokenizer.registry.KINDS`.
        spec: what was given to load it (a path or a tiktoken name), for messages.
        target: the file or name the kind's constructor was given (``spec`` resolved by
            :func:`~bloomline.dataprep.tokenizer.loading.tokenizer_kind`); with
            ``eod_token`` enough to load it again (worker processes do).
        eod_token: the end-of-document token named by the user, or None (found by the kind).
        special_ids: role (``eod``, ``bos``, ``pad``, ``unk``) -> id, for the roles this
            tokenizer has. ``eod`` may be absent: then :attr:`eod_id` raises.
    """

    kind: str = ""

    # -- recognising a kind (see loading.tokenizer_kind for the order they are asked in) ---
    spec_help: str = ""
    """How a ``--tokenizer`` value names this kind, for help and errors ("a tiktoken ...")."""
    suffixes: tuple[str, ...] = ()
    """File suffixes that are this kind whatever the file holds."""
    folder_file: str | None = None
    """The file inside a folder that makes the folder this kind (``tokenizer.json``)."""

    @classmethod
    def claims_name(cls, text: str, exists: bool) -> bool:
        """Whether ``text`` names a tokenizer of this kind without being a file of it (a
        ``tiktoken:NAME``); ``exists``: whether ``text`` is a path that exists."""
        return False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """Whether a file whose first bytes are ``head`` (up to 64) is of this kind."""
        return False

    def __init__(self, spec: str, eod_token: str | None) -> None:
        self.spec = spec
        self.target = spec
        self.eod_token = eod_token
        self._vocab_size = 0  # the kind sets it: its largest id + 1
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

    def token_bytes(self, token_id: int) -> bytes | None:
        """The text one id stands for, as bytes: ``▁the`` -> ``b" the"``, a byte piece
        ``<0xE7>`` -> ``b"\\xe7"``, a byte-level ``çļĦ`` -> ``"的".encode()``; a piece may
        hold part of a character only. For showing pieces as text: a control token gives
        its spelling; None where the kind cannot say (an id no token has)."""
        piece = self.id_to_piece(token_id)
        byte = _BYTE_PIECE.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        return piece.replace(_SPACE_SIGN, " ").encode("utf-8") if piece else None

    def unassigned_ids(self) -> list[int]:
        """Ids below :attr:`vocab_size` that no token has (the gaps), in order: they decode to
        nothing, so generation never picks them."""
        return []

    def control_ids(self) -> list[int]:
        """Ids that decode to nothing (EOD, BOS, PAD, other special tokens)."""
        return sorted(set(self.special_ids.values()))

    def byte_ids(self) -> list[int]:
        """Ids of byte-fallback pieces (``<0xAB>``): text the vocabulary had no piece for."""
        return []

    # -- derived ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The id space: ids are ``0 .. vocab_size - 1``, and ``vocab_size - 1`` is the largest
        id the tokenizer has (an added token's, a special token's). More than the number of
        entries when ids have gaps (see the module docstring). What sizes the model's
        embedding (``model.vocab_size = 0``), the ``.bin`` dtype and per-id arrays, and what
        ids are checked against."""
        return self._vocab_size

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
        corpus and a run must agree on. Computed once (it hashes the whole vocabulary).
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

    # -- exporting --------------------------------------------------------------------------
    specials_read_as_text: bool = False
    """Whether text that spells a special token (``</s>``) encodes as text, as SentencePiece
    and tiktoken do; a ``tokenizer.json`` reads it as the special token."""

    def to_tokenizer_json(self) -> str:
        """The ``tokenizer.json`` text whose ``encode(text).ids`` are :meth:`encode_batch`'s.

        Raises:
            UserError: the kind has no export, or this tokenizer has a feature the
                ``tokenizers`` library cannot reproduce.
        """
        raise UserError(f"{self.spec}: no Hugging Face export for tokenizers of kind "
                        f"{self.kind!r}")

    def export_files(self) -> dict[str, bytes]:
        """Files of this kind's own format shipped beside the ``tokenizer.json``."""
        return {}

    # Worker processes get the file or name and load the tokenizer themselves: shipping a
    # large vocabulary (or a Rust object that cannot be pickled) through a pipe would be
    # slower. The class itself rebuilds it, so this module needs no factory.
    def __reduce__(self):
        return type(self)._unpickle, (self.target, self.eod_token, self.spec)

    @classmethod
    def _unpickle(cls, target: str, eod_token: str | None, spec: str) -> Tokenizer:
        tokenizer = cls(target, eod_token)
        tokenizer.spec = spec
        return tokenizer

    def __repr__(self) -> str:
        return f"<{self.kind} tokenizer {self.spec} vocab={self.vocab_size}>"
