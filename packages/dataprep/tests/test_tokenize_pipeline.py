"""dataprep tokenize: every input format, worker-count independence, keys, EOD, Unicode."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import zstandard

from bloomline.dataprep import IndexedDataset, Tokenizer, load_tokenizer, tokenize_corpus
from conftest import UNICODE_TEXTS

TEXTS = [f"Document {i}: " + "the quick brown fox " * (i % 7) + UNICODE_TEXTS[i % 5]
         for i in range(120)]
TEXTS[5] = ""  # an empty document: no sequence, a repeated boundary (Megatron's convention)


def _expected(tokenizer_path, texts, append_eod=True):
    tok = load_tokenizer(tokenizer_path)
    out = []
    for text in texts:
        ids = [int(i) for i in tok.encode_batch([text])[0]]
        if ids and append_eod:
            ids.append(tok.eod_id)
        out.append(ids)
    return out


def _documents(prefix):
    """Token lists per document, empty documents included, read back through the index."""
    ds = IndexedDataset(prefix)
    ds.verify()
    docs = []
    for d in range(ds.num_documents):
        lo, hi = ds.document_indices[d], ds.document_indices[d + 1]
        docs.append([int(t) for i in range(lo, hi) for t in ds[i]])
    return docs


def _jsonl_bytes(texts, key="text"):
    return "".join(json.dumps({"id": i, key: t}) + "\n" for i, t in enumerate(texts)).encode()


@pytest.mark.slow
def test_jsonl_matches_direct_encoding_and_workers_give_identical_bytes(tmp_path,
                                                                        tiny_tokenizer):
    """Catches: reordered chunks, lost or duplicated documents at chunk edges, and output
    bytes that depend on the number of workers."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(TEXTS))
    summaries = {}
    for workers in (1, 2):
        # 1 KiB chunks: dozens of chunks, so two workers really interleave
        summaries[workers] = tokenize_corpus([str(src)], str(tiny_tokenizer),
                                             str(tmp_path / f"w{workers}"), workers=workers,
                                             max_chunk_bytes=1024, show_progress=False)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"w1{suffix}").read_bytes() == (tmp_path / f"w2{suffix}").read_bytes()
    assert _documents(tmp_path / "w1") == _expected(tiny_tokenizer, TEXTS)
    summary = summaries[2]
    assert summary.num_documents == len(TEXTS) and summary.num_empty == {"text": 1}
    assert summary.num_tokens["text"] == IndexedDataset(tmp_path / "w2").num_tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "in.jsonl", "w1.bin", "w1.fingerprint.json", "w1.idx",
        "w2.bin", "w2.fingerprint.json", "w2.idx"]


def _write_formats(folder, texts):
    """The same documents in every supported input format; returns {format: path}."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    half = len(texts) // 2
    raw = _jsonl_bytes(texts)
    paths = {}
    paths["jsonl.zst"] = folder / "a.jsonl.zst"
    # two concatenated zstd frames, as `cat a.zst b.zst` makes
    first, second = _jsonl_bytes(texts[:half]), _jsonl_bytes(texts[half:])
    cctx = zstandard.ZstdCompressor()
    paths["jsonl.zst"].write_bytes(cctx.compress(first) + cctx.compress(second))
    paths["json.gz"] = folder / "a.json.gz"
    paths["json.gz"].write_bytes(gzip.compress(raw))
    paths["parquet"] = folder / "a.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), paths["parquet"],
                   row_group_size=17)
    paths["hf"] = folder / "hf_dataset"
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(paths["hf"]))
    txt_dir = folder / "txt_files"
    txt_dir.mkdir()
    for i, text in enumerate(texts):
        (txt_dir / f"doc{i:04d}.txt").write_text(text, encoding="utf-8")
    paths["txt files"] = txt_dir
    return paths


@pytest.mark.slow
def test_every_input_format_gives_the_same_documents(tmp_path, tiny_tokenizer):
    """Catches: a reader that drops, reorders or alters documents in one of the formats."""
    texts = [t for t in TEXTS if t]
    expected = _expected(tiny_tokenizer, texts)
    for fmt, path in _write_formats(tmp_path, texts).items():
        out = tmp_path / "out" / fmt.replace(" ", "_")
        tokenize_corpus([str(path)], str(tiny_tokenizer), str(out), workers=2,
                        max_chunk_bytes=512, show_progress=False)
        assert _documents(out) == expected, fmt


def test_txt_per_line_and_globs_keep_argument_then_sorted_order(tmp_path, tiny_tokenizer):
    """Catches: glob matches or argument order not respected (the output order is the
    input order)."""
    (tmp_path / "b.txt").write_text("beta one\n\nbeta two\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("alpha\r\n", encoding="utf-8")
    (tmp_path / "z.txt").write_text("zulu", encoding="utf-8")
    tokenize_corpus([str(tmp_path / "z.txt"), str(tmp_path / "[ab].txt")], str(tiny_tokenizer),
                    str(tmp_path / "out"), txt_per_line=True, show_progress=False)
    assert _documents(tmp_path / "out") == _expected(
        tiny_tokenizer, ["zulu", "alpha", "beta one", "beta two"])


@pytest.mark.slow
def test_several_json_keys_give_one_complete_pair_each(tmp_path, tiny_tokenizer):
    """Catches: Megatron's bug where only the last key gets its .idx, or keys misaligned."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"title": f"T{i}", "text": t}) + "\n"
                           for i, t in enumerate(TEXTS)), encoding="utf-8")
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "c"),
                    keys=["title", "text"], workers=2, max_chunk_bytes=2048, show_progress=False)
    assert _documents(tmp_path / "c_text") == _expected(tiny_tokenizer, TEXTS)
    assert _documents(tmp_path / "c_title") == _expected(
        tiny_tokenizer, [f"T{i}" for i in range(len(TEXTS))])


def test_no_append_eod(tmp_path, tiny_tokenizer):
    """Catches: --no-append-eod ignored (EOD still written)."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(TEXTS[:10]))
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "o"), append_eod=False,
                    show_progress=False)
    assert _documents(tmp_path / "o") == _expected(tiny_tokenizer, TEXTS[:10],
                                                   append_eod=False)


def test_unicode_survives_tokenize_and_decode(tmp_path, tiny_tokenizer):
    """Catches: normalization (NFKC) or lost bytes changing Cyrillic, CJK, emoji or
    combining marks on the way through the token files."""
    src = tmp_path / "u.jsonl"
    src.write_bytes(_jsonl_bytes(UNICODE_TEXTS))
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "u"), show_progress=False)
    tok = load_tokenizer(tiny_tokenizer)
    ds = IndexedDataset(tmp_path / "u")
    for i, text in enumerate(UNICODE_TEXTS):
        tokens = ds[i]
        assert tokens[-1] == tok.eod_id
        assert tok.decode(tokens[:-1]) == text


def test_large_vocab_uses_int32(tmp_path, tiny_tokenizer, monkeypatch):
    """Catches: ids >= 65500 written as uint16 (silently wrapped)."""
    monkeypatch.setattr(Tokenizer, "token_dtype", property(lambda self: np.dtype(np.int32)))
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(TEXTS[:5]))
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "o"), show_progress=False)
    assert IndexedDataset(tmp_path / "o").dtype == np.int32


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: processes
def test_skip_bad_lines_counts_and_keeps_the_rest(tmp_path, tiny_tokenizer, workers):
    """Catches: bad lines silently dropped without being counted, or good lines lost."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "good one"}\n{"text": oops}\n{"other": "x"}\n'
                    b'{"text": 7}\n{"text": "caf\xff"}\n{"text": "good two"}\n')
    summary = tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "o"),
                              skip_bad_lines=True, workers=workers, show_progress=False)
    assert summary.num_skipped == 4 and summary.num_documents == 2
    assert any("in.jsonl:2: malformed JSON" in m for m in summary.skipped_messages)
    assert _documents(tmp_path / "o") == _expected(tiny_tokenizer, ["good one", "good two"])


def test_chunks_taper_so_workers_finish_together():
    """Catches: a small corpus cut into one 8 MiB chunk (all but one worker idle), or a big
    one ending on a full-size chunk that one worker tokenizes while the others wait."""
    from bloomline.dataprep.sources import DEFAULT_CHUNK_BYTES, MIN_CHUNK_BYTES, ChunkSizer

    small = ChunkSizer(3_000_000, workers=2)
    assert small.next_size() * 2 < 3_000_000
    big = ChunkSizer(200 << 20, workers=2)
    sizes = []
    while big.remaining > 0:
        sizes.append(big.next_size())
        big.consumed(sizes[-1])
    assert sizes[0] == DEFAULT_CHUNK_BYTES
    assert sizes == sorted(sizes, reverse=True)  # never growing again
    assert sizes[-1] == MIN_CHUNK_BYTES and len(sizes) < 100
