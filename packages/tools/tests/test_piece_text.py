"""``inspect-data tokens``: each top piece also shown as the text it stands for."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bloomline.dataprep import load_tokenizer, tokenize_corpus
from bloomline.tools.vocab import readable_bytes

# 的 (e7 9a 84) is the most frequent character of Chinese text
TEXTS = ["我们的东西的价格的变化 the cat and the dog", "日本の首都は東京です。的的的 the end"]


def test_readable_bytes_writes_partial_characters_as_hex():
    """Bug: a byte-level piece ending inside a character shown as '�' or dropped, which says
    nothing about which bytes it holds."""
    assert readable_bytes("的".encode()) == "的"
    assert readable_bytes(b" \xe7\x9a") == " <e7 9a>"
    assert readable_bytes(b"\x84ab\xe7") == "<84>ab<e7>"


@pytest.mark.parametrize("fixture", ["tiny_byte_bpe", "tiny_tiktoken", "tiny_tokenizer"])
def test_tokens_shows_each_piece_as_text(fixture, request, tmp_path, inspect):
    """Bug: `inspect-data tokens` listed byte-level pieces only as the vocabulary spells them
    ('Ġ' for a space, 'çļĦ' for 的), unreadable without the byte table. Each row now has the
    text of its piece: the tokenizer's own decoding where the piece is whole characters, hex
    bytes where it holds part of one; a document's pieces' bytes are the document again."""
    if fixture == "tiny_tiktoken":
        pytest.importorskip("tiktoken")
    spec = request.getfixturevalue(fixture)
    tokenizer = load_tokenizer(spec)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 5), encoding="utf-8")
    tokenize_corpus([str(src)], str(spec), str(tmp_path / "c"), show_progress=False)
    code, out, _ = inspect("tokens", tmp_path / "c", "--tokenizer", spec, "--json",
                           "--top", "1000")
    rows = json.loads(out)["top"]
    assert code == 0 and rows
    for row in rows:
        if row["id"] == tokenizer.eod_id:
            assert row["text"] == f"⟦{row['piece']}⟧"
            continue
        spelled = tokenizer.token_bytes(row["id"])
        whole = re.fullmatch(r"[^<>]*", row["text"])  # no <xx> bytes: whole characters
        if whole and fixture != "tiny_tokenizer":  # SentencePiece drops a leading space
            assert row["text"] == tokenizer.decode([row["id"]]), row
        if whole:
            assert row["text"].encode() == spelled, row
    for text in TEXTS:  # the pieces' bytes, put together, are the text
        ids = tokenizer.encode_batch([text])[0].tolist()
        joined = b"".join(tokenizer.token_bytes(i) for i in ids)
        assert joined.decode().strip() == text, fixture
    if fixture == "tiny_byte_bpe":
        by_piece = {row["piece"]: row["text"] for row in rows}
        assert by_piece.get("Ġthe") == " the"
        assert any(re.fullmatch(r"<[0-9a-f]{2}( [0-9a-f]{2})*>", t) for t in by_piece.values())
    code, table, _ = inspect("tokens", tmp_path / "c", "--tokenizer", spec, "--top", "5")
    assert code == 0 and re.search(r"\bpiece +text\b", table)
    for row in rows[:5]:
        assert f"{row['piece']!r}" in table and f"{row['text']!r}" in table


def test_byte_level_alphabet_is_the_libraries():
    """Bug: a byte-level alphabet that differs from the tokenizers library's in one
    character: that byte's pieces would read as another byte."""
    from tokenizers.pre_tokenizers import ByteLevel

    from bloomline.dataprep.tokenizer.byte_level import BYTE_OF_CHAR, CHAR_OF_BYTE, piece_bytes

    assert set(CHAR_OF_BYTE.values()) == set(ByteLevel.alphabet())
    assert sorted(BYTE_OF_CHAR.values()) == list(range(256))
    assert piece_bytes("çļĦ") == "的".encode() and piece_bytes("Ġthe") == b" the"
    assert np.all([len(c) == 1 for c in BYTE_OF_CHAR])
