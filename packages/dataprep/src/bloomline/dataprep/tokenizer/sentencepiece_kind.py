"""SentencePiece ``.model`` files (Megatron's ``GPTSentencePieceTokenizer``).

EOD is the model's ``eos`` piece (``</s>`` in models trained here), or ``eod_token`` when given.
Models trained by ``dataprep train-tokenizer`` use a fixed layout of special ids that Hugging
Face's BLOOM config also uses: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (EOD), ``<pad>`` 3.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import Tokenizer
from bloomline.dataprep.tokenizer.sentencepiece_convert import sentencepiece_to_tokenizers

__all__ = ["SentencePieceTokenizer"]

# first byte of a serialized SentencePiece ModelProto: field 1 (pieces), length-delimited
_MODEL_PROTO_FIRST_BYTE = b"\x0a"


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model.

    Raises:
        UserError: when the file is missing or not a SentencePiece model, or ``eod_token`` is
            not one of its pieces.
    """

    kind = "sentencepiece"
    spec_help = "a SentencePiece .model"
    suffixes = (".model",)
    folder_file = "tokenizer.model"
    specials_read_as_text = True

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head[:1] == _MODEL_PROTO_FIRST_BYTE  # a .model under another name

    def __init__(self, spec: str, eod_token: str | None = None) -> None:
        import sentencepiece as spm

        super().__init__(spec, eod_token)
        if not os.path.isfile(spec):
            raise UserError(f"{spec}: tokenizer model not found")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(spec)
        except (OSError, RuntimeError) as err:
            raise UserError(f"{spec}: not a readable SentencePiece model "
                            f"({str(err).splitlines()[0]})") from None
        self._vocab_size = self._sp.GetPieceSize()  # pieces have the ids 0 .. size - 1
        roles = {"unk": self._sp.unk_id(), "bos": self._sp.bos_id(), "eod": self._sp.eos_id(),
                 "pad": self._sp.pad_id()}
        if eod_token is not None:
            piece_id = self._sp.PieceToId(eod_token)
            if self._sp.IdToPiece(piece_id) != eod_token:  # unknown pieces map to <unk>
                raise UserError(f"{spec}: --eod-token {eod_token!r} is not a piece of the model")
            roles["eod"] = piece_id
        self.special_ids = {role: i for role, i in roles.items() if i >= 0}

    def _eod_hint(self) -> str:
        return " (the model has no eos piece)"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # return_type="numpy" hands the ids over as raw buffers: no Python int per token,
        # which is about 5% of the encode time and most of the cost of flattening into a .bin.
        return self._sp.Encode(texts, return_type="numpy", num_threads=1)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._sp.Decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.IdToPiece(int(token_id))

    def control_ids(self) -> list[int]:
        ids = list(range(self.vocab_size))  # one batched call, not one per id
        control = set(np.flatnonzero(self._sp.IsControl(ids)).tolist())
        if "eod" in self.special_ids:  # an --eod-token may be a normal piece
            control.add(self.special_ids["eod"])
        return sorted(control)  # <unk> is not control: it stands for text and decodes as such

    def byte_ids(self) -> list[int]:
        return np.flatnonzero(self._sp.IsByte(list(range(self.vocab_size)))).tolist()

    def _vocabulary_entries(self) -> Iterable[bytes]:
        return (piece.encode("utf-8") for piece in
                self._sp.IdToPiece(list(range(self.vocab_size))))

    def serialized_model_proto(self) -> bytes:
        """The model as loaded: a ``.model`` file's bytes (for exporting and converting)."""
        return self._sp.serialized_model_proto()

    def to_tokenizer_json(self) -> str:
        return sentencepiece_to_tokenizers(self.serialized_model_proto(), self.spec).to_str()

    def export_files(self) -> dict[str, bytes]:
        # the original, for sentencepiece users and tools that want the .model
        return {"tokenizer.model": self.serialized_model_proto()}
