"""``inspect-data summary``, ``verify``, ``show``, ``tokens``, ``diff`` and bad input."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bloomline.tools.corpus as corpus_module
import bloomline.tools.token_stats as token_stats_module
from bloomline.dataprep import (
    IndexedDataset,
    IndexedDatasetWriter,
    load_tokenizer,
    tokenize_corpus,
)

HEADER = 34  # bytes of the MMIDIDX header: magic 9, version 8, dtype 1, counts 8 + 8


def _one_line_error(code: int, err: str, names: str) -> None:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert names in lines[0], err
    assert "Traceback" not in err


def test_summary_figures_match_the_index(corpus, inspect):
    """Catches: wrong document/token counts, empty documents not counted, percentiles over
    sequences instead of documents, a largest id from the first chunk only, folder totals
    that drop a dataset."""
    code, out, _ = inspect("summary", corpus["dir"], "--json")
    assert code == 0
    result = json.loads(out)
    for name in ("a", "b"):
        docs = corpus[f"docs_{name}"]
        row = result["datasets"][name]
        lengths = np.array([len(d) for d in docs])
        assert row["documents"] == len(docs) and row["tokens"] == lengths.sum()
        assert row["empty_documents"] == np.count_nonzero(lengths == 0)
        assert row["largest_token_id"] == max(int(d.max()) for d in docs if d.size)
        assert row["document_tokens"]["max"] == lengths.max()
        assert row["document_tokens"]["p50"] == int(
            np.percentile(lengths, 50, method="inverted_cdf"))
        assert row["format"] == "ok" and row["dtype"] == "uint16"
        assert row["bin_bytes"] == 2 * lengths.sum()
    total = result["total"]
    assert total["documents"] == len(corpus["docs_a"]) + len(corpus["docs_b"])
    assert total["empty_documents"] == 2 and result["ok"]
    code, out, _ = inspect("summary", corpus["a"])
    assert code == 0 and "format a: ok" in out and "TOTAL" not in out


def test_summary_of_corrupted_offsets_exits_1(corpus_copy, inspect):
    """Catches: summary printing "ok" (or figures read through a wrong offset) for an index
    whose offsets do not follow from the lengths: opening refuses it, naming the file."""
    with open(corpus_copy / "a.idx", "r+b") as fh:
        num = IndexedDataset(corpus_copy / "a").sequence_lengths.size
        fh.seek(HEADER + 4 * num + 8 * 5)
        fh.write(struct.pack("<q", 3))
    code, out, err = inspect("summary", corpus_copy)
    _one_line_error(code, err, "a.idx: corrupted index: byte offset of sequence 5")
    assert out == ""


def test_verify_passes_a_sound_corpus(corpus, inspect):
    """Catches: verify failing on good data (e.g. the vocab check off by one: the largest id
    equal to vocab_size - 1 is valid) or --json not giving the verdict."""
    code, out, _ = inspect("verify", corpus["dir"], "--tokenizer", corpus["tokenizer"],
                           "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"] and set(result["datasets"]) == {"a", "b"}
    assert "token ids < 512" in result["checks"]
    code, out, _ = inspect("verify", corpus["a"])
    assert code == 0 and out.startswith(f"{corpus['a']}: ok")


def _truncate_bin(folder: Path) -> None:
    with open(folder / "b.bin", "r+b") as fh:
        fh.truncate(os.path.getsize(folder / "b.bin") - 2)


def _bad_magic(folder: Path) -> None:
    with open(folder / "b.idx", "r+b") as fh:
        fh.write(b"NOTANIDX!")


def _truncate_idx(folder: Path) -> None:
    with open(folder / "b.idx", "r+b") as fh:
        fh.truncate(os.path.getsize(folder / "b.idx") - 8)


def _decreasing_boundaries(folder: Path) -> None:
    dataset = IndexedDataset(folder / "b")
    num = len(dataset)
    del dataset
    with open(folder / "b.idx", "r+b") as fh:
        fh.seek(HEADER + 12 * num + 8 * 3)  # document boundary 3 set below boundary 2
        fh.write(struct.pack("<q", 0))


def _offset(value: int, sequence: int = 4):
    def corrupt(folder: Path) -> None:
        num = IndexedDataset(folder / "b").sequence_lengths.size
        with open(folder / "b.idx", "r+b") as fh:
            fh.seek(HEADER + 4 * num + 8 * sequence)
            fh.write(struct.pack("<q", value))
    return corrupt


def _float32(folder: Path) -> None:
    """b as a float32 file: the same values as floats, dtype code 7 (Megatron's float32)."""
    dataset = IndexedDataset(folder / "b")
    tokens = np.frombuffer((folder / "b.bin").read_bytes(), np.uint16).astype(np.float32)
    index = bytearray((folder / "b.idx").read_bytes())
    num = len(dataset)
    pointers = dataset.sequence_pointers * 2
    del dataset
    index[17] = 7
    index[HEADER + 4 * num : HEADER + 12 * num] = pointers.tobytes()
    (folder / "b.idx").write_bytes(bytes(index))
    (folder / "b.bin").write_bytes(tokens.tobytes())


CORRUPTIONS = {
    "truncated .bin": (_truncate_bin, "b.bin: truncated"),
    "negative offset": (_offset(-8), "b.idx: corrupted index: byte offset of sequence 4 "
                        "(document 4) is -8, expected "),
    "offset past the .bin": (_offset(1 << 40), "b.idx: corrupted index: byte offset of "
                             "sequence 4 (document 4) is 1099511627776, expected "),
    "float32 tokens": (_float32, "b.idx: not a valid MMIDIDX index: dtype code 7 (float32) "
                       "is not an integer type"),
    "bad header": (_bad_magic, "b.idx: not a valid MMIDIDX index: bad magic"),
    "truncated .idx": (_truncate_idx, "b.idx: not a valid MMIDIDX index: truncated"),
    "decreasing boundaries": (_decreasing_boundaries, "b.idx: corrupted index: document "
                              "boundaries decrease"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_files_give_one_line_and_exit_1(corpus_copy, corpus, inspect, kind):
    """Catches: a traceback from deep inside numpy, exit code 0, or an error that does not
    name the file, for each kind of damage, in every command that reads the file."""
    corrupt, message = CORRUPTIONS[kind]
    corrupt(corpus_copy)
    index = ["--seq-length", 16, "--train-samples", 20, "--split", "90,10"]
    for args in (["verify", corpus_copy], ["verify", corpus_copy / "b"],
                 ["summary", corpus_copy / "b"], ["show", corpus_copy / "b", "--doc", "4"],
                 ["tokens", corpus_copy / "b", "--tokenizer", corpus["tokenizer"]],
                 ["diff", corpus_copy / "a", corpus_copy / "b"],
                 ["sample", corpus_copy, "--index", 0, *index],
                 ["blend", corpus_copy, *index]):
        code, _, err = inspect(*args)
        _one_line_error(code, err, message)


def test_verify_checks_the_index_cache_of_a_folder(corpus_copy, corpus, inspect):
    """Catches: verify passing a corpus folder whose index cache (CORPUS/.index) holds a
    tampered or truncated file, which the trainer would load (before: a segfault in the
    compiled gather, or a hang). Verify names the file and says to delete the entry; a sound
    cache passes and an entry of a rewritten file is stale, not an error."""
    index = ["--seq-length", 16, "--train-samples", 20, "--split", "90,10"]
    code, _, err = inspect("blend", corpus_copy, *index)
    assert code == 0, err
    code, out, _ = inspect("verify", corpus_copy, "--json")
    assert code == 0 and json.loads(out)["index_cache"]["checked"] == 6  # 2 x 2 + 2 blends
    entry = next((corpus_copy / ".index").glob("gpt-train-a-*"))
    order = np.load(entry / "shuffle_index.npy")
    order[3] = 10**6
    np.save(entry / "shuffle_index.npy", order)
    code, _, err = inspect("verify", corpus_copy)
    _one_line_error(code, err, f"{entry}/shuffle_index.npy: entry 3 is 1000000, outside the "
                    f"samples built [0, {len(order)}); delete {entry} (build-index or the "
                    "trainer rebuilds it)")
    with open(entry / "sample_index.npy", "r+b") as fh:  # truncated (a killed copy)
        fh.truncate(os.path.getsize(entry / "sample_index.npy") - 8)
    code, _, err = inspect("verify", corpus_copy)
    _one_line_error(code, err, f"{entry}/sample_index.npy: unreadable or truncated")
    shutil.rmtree(entry)
    _rewrite(corpus_copy / "a", corpus["docs_a"][:30])  # the other entries of a are stale now
    code, out, _ = inspect("verify", corpus_copy)
    assert code == 0 and "index cache (2 entries, 3 stale skipped)" in out


def test_token_id_above_the_vocabulary_is_located(corpus_copy, corpus, inspect, monkeypatch):
    """Catches: ids >= vocab size passing verify, the scan stopping after the first chunk, or
    an error naming the wrong document/position (token numbers mixed up with bytes)."""
    dataset = IndexedDataset(corpus_copy / "b")
    document, position = 20, 3
    byte = int(dataset.sequence_pointers[document]) + 2 * position
    del dataset
    with open(corpus_copy / "b.bin", "r+b") as fh:
        fh.seek(byte)
        fh.write(struct.pack("<H", 600))
    # chunks of 64 tokens: the bad id sits in a later chunk, not the first
    monkeypatch.setattr(corpus_module, "CHUNK_BYTES", 128)
    monkeypatch.setattr(token_stats_module, "_HISTOGRAM_CHUNK_BYTES", 128)
    expected = (f"b.bin: token id 600 at document {document} (sequence {document}), "
                f"position {position}: not below the vocabulary size 512")
    code, out, err = inspect("verify", corpus_copy, "--tokenizer", corpus["tokenizer"],
                             "--json")
    _one_line_error(code, err, expected)
    assert json.loads(out)["ok"] is False
    code, _, err = inspect("tokens", corpus_copy / "b", "--tokenizer", corpus["tokenizer"])
    _one_line_error(code, err, expected)
    code, out, _ = inspect("verify", corpus_copy / "b", "--json")  # no vocab: reported only
    assert code == 0 and json.loads(out)["datasets"]["b"]["largest_token_id"] == 600


def test_show_decodes_a_document_or_prints_ids(corpus, inspect):
    """Catches: document N read from sequence N (wrong after an empty document), the EOD
    dropped silently, or ids printed from the wrong offset."""
    docs = corpus["docs_a"]
    tokenizer = load_tokenizer(corpus["tokenizer"])
    number = 19  # after the empty documents 0 and 18: sequence 17
    code, out, _ = inspect("show", corpus["a"], "--doc", number, "--json")
    result = json.loads(out)
    assert code == 0 and result["tokens"] == docs[number].tolist()
    assert result["sequences"] == [number - 2]
    code, out, _ = inspect("show", corpus["a"], "--doc", number, "--tokenizer",
                           corpus["tokenizer"])
    text = out.split("\n", 1)[1].rstrip("\n")
    assert text == tokenizer.decode(docs[number][:-1]) + "⟦</s>⟧"
    code, out, _ = inspect("show", corpus["a"], "--doc", 18)
    assert code == 0 and "(no sequence), 0 tokens" in out  # an empty document
    code, _, err = inspect("show", corpus["a"], "--doc", len(docs))
    _one_line_error(code, err, f"--doc {len(docs)}: ")


def test_show_refuses_a_tokenizer_too_small_for_the_file(tmp_path, corpus, inspect):
    """Catches: SentencePiece raising IndexError (a traceback) when decoding ids of another,
    larger vocabulary."""
    with IndexedDatasetWriter(tmp_path / "big", np.uint16) as writer:
        writer.add_document(np.array([5, 9000, 2]))
    code, _, err = inspect("show", tmp_path / "big", "--doc", 0, "--tokenizer",
                           corpus["tokenizer"])
    _one_line_error(code, err, "document 0: token id 9000 at position 1 is not below")


def test_tokens_histogram_figures(corpus, inspect):
    """Catches: a histogram that misses tokens (chunk edges), top tokens in the wrong order,
    EOD not counted, byte-fallback or unused shares computed over the wrong base."""
    tokens = np.concatenate(corpus["docs_b"])
    code, out, _ = inspect("tokens", corpus["b"], "--tokenizer", corpus["tokenizer"],
                           "--top", 5, "--json")
    result = json.loads(out)
    counts = np.bincount(tokens, minlength=512)
    assert code == 0 and result["tokens"] == len(tokens)
    assert [row["count"] for row in result["top"]] == sorted(counts, reverse=True)[:5]
    assert result["top"][0]["id"] == int(np.argmax(counts))
    assert result["eod_count"] == len(corpus["docs_b"])
    byte_ids = [i for i in range(512) if load_tokenizer(corpus["tokenizer"]).id_to_piece(i)
                .startswith("<0x")]
    assert result["byte_fallback_tokens"] == counts[byte_ids].sum() > 0  # the emoji
    assert result["unused_ids"] == np.count_nonzero(counts == 0)
    code, out, _ = inspect("tokens", corpus["b"], "--tokenizer", corpus["tokenizer"])
    assert code == 0 and "byte fallback:" in out and "EOD (id 2)" in out


def _rewrite(prefix: Path, documents: list[np.ndarray], dtype=np.uint16) -> None:
    with IndexedDatasetWriter(prefix, dtype, overwrite=True) as writer:
        for tokens in documents:
            writer.add_document(tokens)


def test_diff_finds_the_first_difference(tmp_path, corpus, inspect, monkeypatch):
    """Catches: a diff that reports the last or a wrong difference, misses a document split
    differently over the same token stream, misses an extra document, or calls the same data
    in another dtype different."""
    monkeypatch.setattr(corpus_module, "CHUNK_BYTES", 64)  # differences past the first chunk
    docs = [d for d in corpus["docs_b"]]
    code, out, _ = inspect("diff", corpus["b"], corpus["b"])
    assert code == 0 and out.startswith("identical")

    changed = [d.copy() for d in docs]
    changed[7][4] = 1
    changed[9][0] = 1  # a later difference: not the one reported
    _rewrite(tmp_path / "changed", changed)
    code, out, _ = inspect("diff", corpus["b"], tmp_path / "changed", "--json")
    first = json.loads(out)["first_difference"]
    assert code == 1 and (first["document"], first["token"]) == (7, 4)
    assert (first["a"], first["b"]) == (int(docs[7][4]), 1)

    resplit = docs[:3] + [np.concatenate(docs[3:5])] + docs[5:]  # same tokens, one doc less
    _rewrite(tmp_path / "resplit", resplit)
    code, out, _ = inspect("diff", corpus["b"], tmp_path / "resplit", "--json")
    first = json.loads(out)["first_difference"]
    assert code == 1 and (first["document"], first["token"]) == (3, len(docs[3]))
    assert first["reason"] == "document lengths differ"

    _rewrite(tmp_path / "longer", docs + [np.array([5, 2])])
    code, out, _ = inspect("diff", corpus["b"], tmp_path / "longer")
    assert code == 1 and f"document {len(docs)}, token 0: only b has this document" in out

    _rewrite(tmp_path / "wide", docs, dtype=np.int32)
    code, out, _ = inspect("diff", corpus["b"], tmp_path / "wide")
    assert code == 0 and "(int32)" in out


@pytest.mark.slow
def test_console_script_is_installed(corpus):
    """Catches: the `inspect-data` entry point missing from the tools distribution, or a
    user error that escapes as a traceback when run as a real process."""
    script = Path(sys.executable).with_name("inspect-data")
    if not script.exists():
        script = shutil.which("inspect-data")
    assert script, "inspect-data not installed: pip install -e tools"
    ok = subprocess.run([str(script), "verify", str(corpus["dir"])], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([str(script), "show", str(corpus["a"]), "--doc", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error: --doc -1")
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("fixture", ["tiny_byte_bpe", "tiny_tiktoken"])
def test_show_and_tokens_with_other_tokenizer_kinds(fixture, request, tmp_path, inspect):
    """Catches: the tools reading only SentencePiece models (a tokenizer.json or .tiktoken
    refused or decoded wrongly), and EOD shown as text or dropped instead of marked."""
    if fixture == "tiny_tiktoken":
        pytest.importorskip("tiktoken")
    spec = request.getfixturevalue(fixture)
    tokenizer = load_tokenizer(spec)
    texts = ["The quick brown fox.", "Привет, мир! 👍"]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    tokenize_corpus([str(src)], str(spec), str(tmp_path / "c"), show_progress=False)
    eod = {"tiny_byte_bpe": "</s>", "tiny_tiktoken": "<|endoftext|>"}[fixture]
    for number, text in enumerate(texts):
        code, out, _ = inspect("show", tmp_path / "c", "--doc", number, "--tokenizer", spec)
        assert code == 0 and out.split("\n", 1)[1].rstrip("\n") == f"{text}⟦{eod}⟧"
    code, out, _ = inspect("tokens", tmp_path / "c", "--tokenizer", spec, "--json")
    result = json.loads(out)
    assert code == 0 and result["eod_id"] == tokenizer.eod_id and result["eod_count"] == 2
