"""A SentencePiece model as a ``tokenizers`` pipeline that gives the same ids.

SentencePiece runs its model on the whole normalized text: no pre-tokenizer split. So does the
converted pipeline:

- normalizer: the model's precompiled character map (when it has rules), its whitespace
  clean-up (``remove_extra_whitespaces``), spaces escaped to ``▁`` and the dummy prefix
  (``add_dummy_prefix``). ``Prepend`` rather than the ``Metaspace`` pre-tokenizer: Metaspace
  adds no prefix to text that already starts with a space, SentencePiece always does (models
  with user-defined pieces need Metaspace, see :func:`sentencepiece_to_tokenizers`).
- model: ``BPE`` with the merges SentencePiece would make (every split of a piece into two
  pieces, ranked by the piece's score: SentencePiece merges the adjacent pair whose result
  scores highest), or ``Unigram`` with the scores; both with the byte fallback when the model
  has one, unknown characters fused as SentencePiece fuses them.
- decoder: ``▁`` back to spaces, byte pieces to bytes, the dummy prefix's space dropped.

The model proto is read with a small protobuf reader of our own (the few fields needed), so
that no protobuf runtime or generated code is needed.

Refused, naming the field: ``WORD``/``CHAR`` models and ``treat_whitespace_as_suffix``.
Known differences (packages/trainer/README.md lists them): a ``Unigram`` model in ``tokenizers``
also matches its control and byte pieces when text spells them (``</s>``, ``<0x41>``),
SentencePiece never does; ``tokenizers``' ``Precompiled`` normalizer treats some combining
marks and CR LF otherwise; ``<unk>`` decodes to nothing, not `` ⁇ ``; a run of byte pieces
mixing a whole multi-byte character with broken bytes decodes to more U+FFFD.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from bloomline.common.errors import UserError

__all__ = ["SentencePieceModel", "read_sentencepiece_model", "sentencepiece_to_tokenizers"]

# ModelProto.SentencePiece.Type and TrainerSpec.ModelType (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNIGRAM, _BPE = 1, 2
_MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}
_SPACE = "\u2581"  # ▁, SentencePiece's escaped space


@dataclass
class SentencePieceModel:
    """The fields of a SentencePiece ``ModelProto`` the conversion needs (proto defaults)."""

    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # piece, score, type
    model_type: int = _UNIGRAM
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` of one protobuf message: varints as ints, fixed32/fixed64
    and length-delimited fields as their bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        elif wire_type == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:  # groups (3, 4) are not used by sentencepiece_model.proto
            raise ValueError(f"wire type {wire_type}")
        if pos > len(data):
            raise ValueError("truncated message")
        yield number, value


def read_sentencepiece_model(proto: bytes) -> SentencePieceModel:
    """Parse a serialized ``ModelProto`` (the bytes of a ``.model`` file).

    Raises:
        ValueError: bytes that are not a protobuf message.
    """
    model = SentencePieceModel()
    for number, value in _fields(proto):
        if number == 1:  # pieces
            piece, score, kind = "", 0.0, _NORMAL
            for sub, sub_value in _fields(value):
                if sub == 1:
                    piece = sub_value.decode("utf-8")
                elif sub == 2:
                    score = struct.unpack("<f", sub_value)[0]
                elif sub == 3:
                    kind = sub_value
            model.pieces.append((piece, score, kind))
        elif number == 2:  # trainer_spec
            for sub, sub_value in _fields(value):
                if sub == 3:
                    model.model_type = sub_value
                elif sub == 24:
                    model.treat_whitespace_as_suffix = bool(sub_value)
                elif sub == 35:
                    model.byte_fallback = bool(sub_value)
        elif number == 3:  # normalizer_spec
            for sub, sub_value in _fields(value):
                if sub == 2:
                    model.precompiled_charsmap = bytes(sub_value)
                elif sub == 3:
                    model.add_dummy_prefix = bool(sub_value)
                elif sub == 4:
                    model.remove_extra_whitespaces = bool(sub_value)
                elif sub == 5:
                    model.escape_whitespaces = bool(sub_value)
    return model


def _bpe_merges(model: SentencePieceModel) -> list[tuple[str, str]]:
    """SentencePiece's BPE merges, best first: each normal piece, by score (then id), from every
    pair of pieces it splits into. SentencePiece merges any adjacent pair whose concatenation is
    a piece, so every split is a merge, at the rank of the piece it makes."""
    mergeable = {piece for piece, _, kind in model.pieces if kind in (_NORMAL, _USER_DEFINED)}
    order = sorted((i for i, (_, _, kind) in enumerate(model.pieces) if kind == _NORMAL),
                   key=lambda i: (-model.pieces[i][1], i))
    merges = []
    for i in order:
        piece = model.pieces[i][0]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((left, right))
    return merges


def sentencepiece_to_tokenizers(proto: bytes, name: str = "SentencePiece model"):
    """A ``tokenizers.Tokenizer`` that encodes and decodes as the SentencePiece model does.

    Args:
        proto: the serialized model (a ``.model`` file's bytes).
        name: what to call it in errors (its path).

    Raises:
        UserError: a model that is not readable, or uses a feature the pipeline cannot
            reproduce.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    try:
        model = read_sentencepiece_model(proto)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as err:
        raise UserError(f"{name}: not a readable SentencePiece model ({err})") from None
    if model.model_type not in (_UNIGRAM, _BPE):
        raise UserError(f"{name}: a SentencePiece {_MODEL_TYPES.get(model.model_type, '?')} "
                        "model cannot be converted to a tokenizer.json (only BPE and unigram)")
    if model.treat_whitespace_as_suffix:
        raise UserError(f"{name}: treat_whitespace_as_suffix cannot be converted to a "
                        "tokenizer.json")
    unk_ids = [i for i, (_, _, kind) in enumerate(model.pieces) if kind == _UNKNOWN]
    unk_id = unk_ids[0] if unk_ids else None
    if model.model_type == _BPE:
        vocab = {piece: i for i, (piece, _, _) in enumerate(model.pieces)}
        backend = Tokenizer(models.BPE(
            vocab=vocab, merges=_bpe_merges(model), fuse_unk=True,
            unk_token=None if unk_id is None else model.pieces[unk_id][0],
            byte_fallback=model.byte_fallback))
    else:
        backend = Tokenizer(models.Unigram(
            [(piece, score) for piece, score, _ in model.pieces], unk_id=unk_id,
            byte_fallback=model.byte_fallback))

    space = _SPACE if model.escape_whitespaces else " "
    steps = []
    if model.precompiled_charsmap:
        steps.append(normalizers.Precompiled(model.precompiled_charsmap))
    if model.remove_extra_whitespaces:
        # SentencePiece strips spaces at both ends of the text (not of lines: \A, \z rather
        # than ^, $, which match at every newline) and squeezes runs of them
        steps += [normalizers.Replace(Regex(" {2,}"), " "),
                  normalizers.Replace(Regex(r"\A | \z"), "")]
    if model.escape_whitespaces:
        steps.append(normalizers.Replace(" ", _SPACE))
    user_defined = [piece for piece, _, kind in model.pieces if kind == _USER_DEFINED]
    if model.add_dummy_prefix and not user_defined:
        steps.append(normalizers.Prepend(space))  # empty text stays empty, as in SentencePiece
    elif model.add_dummy_prefix:
        # user-defined pieces are matched in the raw text and the rest normalized piece by
        # piece, so Prepend would put a prefix after each of them; Metaspace's "first" puts it
        # on the first piece only, but not on text that starts with a space or a user-defined
        # piece (SentencePiece would)
        backend.pre_tokenizer = pre_tokenizers.Metaspace(space, prepend_scheme="first",
                                                         split=False)
    if steps:
        backend.normalizer = normalizers.Sequence(steps)

    decoding = [decoders.Replace(_SPACE, " ")] if model.escape_whitespaces else []
    # ByteFallback turns a run of byte pieces that is not valid UTF-8 into one U+FFFD per
    # byte; SentencePiece replaces only the bad bytes. An ASCII byte is a character of its
    # own, so decoding those first keeps "<0xE4><0x3C>" "\ufffd<" as in SentencePiece (runs
    # that mix a whole multi-byte character with broken ones still differ)
    pieces = {piece for piece, _, kind in model.pieces if kind == _BYTE}
    decoding += [decoders.Replace(f"<0x{byte:02X}>", chr(byte)) for byte in range(128)
                 if f"<0x{byte:02X}>" in pieces]
    decoding += [decoders.ByteFallback(), decoders.Fuse()]
    if model.add_dummy_prefix:
        decoding.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decoding)

    # control pieces (<s>, </s>, <pad>) and <unk> are special: skipped by decode(...,
    # skip_special_tokens=True), as SentencePiece's decode skips them. User-defined pieces are
    # matched in the text before the model runs, as SentencePiece matches them.
    backend.add_special_tokens([
        AddedToken(piece, special=True, normalized=False)
        for piece, _, kind in model.pieces if kind in (_CONTROL, _UNKNOWN)])
    backend.add_tokens([AddedToken(piece, special=False, normalized=False)
                        for piece in user_defined])
    return backend
