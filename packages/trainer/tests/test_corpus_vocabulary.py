"""Token files without a tokenizer fingerprint (Megatron's own tools write none): checked
against the run's tokenizer by their ids and document ends when the trainer opens them."""

from __future__ import annotations

import numpy as np
import pytest
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.dataprep import load_tokenizer
from bloomline.dataprep.fingerprint import write_fingerprint
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.data import corpus_vocabulary
from bloomline.trainer.run_spec import settle


def _write(prefix, documents: list[list[int]]) -> None:
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for tokens in documents:
            writer.add_document(np.asarray(tokens, np.uint16))


@pytest.fixture
def run_config(tmp_path, tiny_tokenizer):
    """A tiny run on a corpus folder (filled by each test) with the 512-piece tokenizer,
    whose EOD is 2."""
    (tmp_path / "corpus").mkdir()
    cfg = tiny_config(str(tmp_path / "corpus"), tmp_path / "run")
    cfg.data.tokenizer = str(tiny_tokenizer)
    cfg.model.vocab_size = 512
    return cfg


def test_a_file_without_fingerprint_is_checked_and_the_check_is_said(run_config, tmp_path):
    """Bug: a corpus written by Megatron's tools (no fingerprint) used with any tokenizer
    without a check or a word."""
    _write(tmp_path / "corpus" / "code", [[5, 9, 511, 2], [7, 2], [3, 4, 2], [], [8, 8]])
    lines: list[str] = []
    settle(run_config, log=lines.append)
    assert lines == [f"{tmp_path}/corpus/code: no tokenizer fingerprint (written by another "
                     "tool); checked: 11 tokens all < vocabulary 512, EOD 2 ends 75% of "
                     "documents"]


def test_an_id_beyond_the_vocabulary_is_refused_in_one_line(run_config, tmp_path):
    """Bug: ids of another tokenizer's larger vocabulary trained on (or an embedding lookup
    out of range mid-run) instead of a refusal when the run starts."""
    _write(tmp_path / "corpus" / "code", [[5, 9, 2], [600, 2]])
    with pytest.raises(UserError) as refused:
        settle(run_config)
    assert str(refused.value) == (
        f"{tmp_path}/corpus/code: no tokenizer fingerprint (written by another tool), and "
        f"token id 600 is not below the vocabulary 512 of data.tokenizer "
        f"{run_config.data.tokenizer}: the corpus was made by another tokenizer; tokenize it "
        "with this one, or set data.tokenizer to the one that made it")


def test_fingerprinted_files_are_not_scanned_and_a_low_eod_share_warns(run_config, tmp_path,
                                                                       tiny_tokenizer):
    """Bug: files with a fingerprint read again (their record says it all), or documents
    that do not end with the tokenizer's EOD (another tokenizer's) passed without a word."""
    _write(tmp_path / "corpus" / "a", [[5, 2]])
    write_fingerprint(tmp_path / "corpus" / "a", load_tokenizer(tiny_tokenizer), True)
    _write(tmp_path / "corpus" / "b", [[5, 0], [6, 0], [7, 2]])
    lines: list[str] = []
    settle(run_config, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"warning: {tmp_path}/corpus/b: ")
    assert lines[0].endswith("EOD 2 ends 33% of documents (another tokenizer's EOD, or "
                             "documents written without one)")


def test_a_large_file_is_sampled_and_the_line_says_so(run_config, tmp_path, monkeypatch):
    """Bug: the check reads a whole multi-TB corpus on every rank at start-up (its cost must
    be bounded), or claims a full check it did not make."""
    monkeypatch.setattr(corpus_vocabulary, "FULL_SCAN_TOKENS", 640)
    _write(tmp_path / "corpus" / "big", [[5] * 99 + [2]] * 30)
    lines: list[str] = []
    settle(run_config, log=lines.append)
    assert "checked: 640 of 3,000 tokens (sampled) all < vocabulary 512" in lines[0]
