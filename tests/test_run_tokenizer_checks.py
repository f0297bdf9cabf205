"""The trainer and the tokenizer of its corpus: the vocabulary must fit the model and the
corpus must have been tokenized with the run's tokenizer (its fingerprint)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bloomline.common import UserError
from bloomline.dataprep import tokenize_corpus
from conftest import UNICODE_TEXTS

sys.path.insert(0, str(Path(__file__).parents[1] / "packages" / "trainer" / "tests"))
from trainer_fixtures import tiny_config  # noqa: E402

TEXTS = [f"Document {i}: the quick brown fox. " * (1 + i % 5) + UNICODE_TEXTS[i % 5]
         for i in range(60)]


@pytest.fixture(scope="module")
def sp_corpus(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("sp_corpus")
    src = folder / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(folder / "corpus" / "docs"),
                    show_progress=False)
    return folder / "corpus"


def _trainer(cfg):
    from bloomline.trainer.loop import Trainer

    return Trainer(cfg, log=lambda *_: None)


def test_corpus_of_another_tokenizer_is_refused(sp_corpus, tmp_path, tiny_byte_bpe):
    """Catches: training on ids of one vocabulary with another tokenizer configured (same
    size, so no range check notices): generate and export-hf would decode nonsense."""
    cfg = tiny_config(str(sp_corpus), tmp_path / "run", data={"tokenizer": str(tiny_byte_bpe)},
                      model={"vocab_size": 512})
    with pytest.raises(UserError, match=r"docs: tokenized with sentencepiece tiny.model .* but "
                                        r"data.tokenizer .* is huggingface") as info:
        _trainer(cfg)
    assert "\n" not in str(info.value)


def test_vocabulary_larger_than_the_model_is_refused(sp_corpus, tmp_path,
                                                     bloom_like_tokenizer):
    """Catches: a 65,796-entry tokenizer with a 512-row embedding (ids past the table)."""
    cfg = tiny_config(str(sp_corpus), tmp_path / "run",
                      data={"tokenizer": str(bloom_like_tokenizer)}, model={"vocab_size": 512})
    with pytest.raises(UserError, match="vocabulary of 65796 tokens is larger than "
                                        "model.vocab_size 512"):
        _trainer(cfg)


def test_the_runs_own_tokenizer_sizes_the_vocabulary(sp_corpus, tmp_path, tiny_tokenizer):
    """Catches: the matching tokenizer refused, or model.vocab_size 0 not sized from it."""
    cfg = tiny_config(str(sp_corpus), tmp_path / "run", data={"tokenizer": str(tiny_tokenizer)},
                      model={"vocab_size": 0})
    trainer = _trainer(cfg)
    assert trainer.cfg.model.vocab_size == 512  # 512 padded to a multiple of 128
