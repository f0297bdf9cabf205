"""The dataprep commands chained as a user runs them, on the demo corpus."""

from __future__ import annotations

import numpy as np
import pytest

from bloomline.dataprep import IndexedDataset, load_tokenizer

pytestmark = pytest.mark.slow


def test_demo_corpus_to_token_files_and_merge(tmp_path, cli):
    """Catches: commands that work as functions but not from the command line (flags,
    defaults, console wiring), and a merge that loses or reorders documents."""
    raw, tok, corpus = tmp_path / "raw", tmp_path / "tok" / "demo", tmp_path / "corpus"
    result = cli("demo-corpus", raw, "--size-mb", "0.3")
    assert result.returncode == 0, result.stderr
    result = cli("train-tokenizer", raw, "--vocab-size", "1000", "--output", tok)
    assert result.returncode == 0, result.stderr
    for name, workers in (("one", "1"), ("two", "2")):
        result = cli("tokenize", raw, "--tokenizer", f"{tok}.model", "--output", corpus / name,
                     "--workers", workers, "--chunk-mb", "0.05")
        assert result.returncode == 0, result.stderr
        assert "0 skipped lines" in result.stdout and "tokens/s" in result.stdout
        assert "tokenize 100%" in result.stderr  # the progress line
    assert (corpus / "one.bin").read_bytes() == (corpus / "two.bin").read_bytes()
    assert (corpus / "one.idx").read_bytes() == (corpus / "two.idx").read_bytes()

    one = IndexedDataset(corpus / "one")
    assert one.dtype == np.uint16 and one.num_documents > 100
    text = load_tokenizer(f"{tok}.model").decode(one[0][:-1])
    assert len(text) > 40  # real text came through, not ids of nothing

    result = cli("merge", corpus / "one", corpus / "two", "--output", corpus / "both")
    assert result.returncode == 0, result.stderr
    both = IndexedDataset(corpus / "both")
    assert both.num_documents == 2 * one.num_documents
    np.testing.assert_array_equal(both[len(one)], one[0])
