"""SentencePiece training and loading: special ids, byte fallback, exact round trips."""

from __future__ import annotations

import json
import re

import pytest

from bloomline.common import UserError
from bloomline.dataprep import load_tokenizer, train_tokenizer
from conftest import UNICODE_TEXTS


def test_special_tokens_have_the_documented_ids(tiny_tokenizer):
    """Catches: EOD/PAD missing or moved (the trainer and HF export rely on these ids)."""
    tok = load_tokenizer(tiny_tokenizer)
    assert [tok.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    assert tok.eod_id == 2 and tok.pad_id == 3 and tok.vocab_size == 512


def test_byte_fallback_and_exact_round_trip(tiny_tokenizer):
    """Catches: characters never seen in training becoming <unk> (lost text), or
    normalization rewriting the text (NFKC, collapsed spaces)."""
    tok = load_tokenizer(tiny_tokenizer)
    unseen = "Runes ᚠᚢᚦ and math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, fullwidth ＡＢＣ,   three spaces, ﬁ ligature"
    for text in [*UNICODE_TEXTS, unseen]:
        ids = [int(i) for i in tok.encode_batch([text])[0]]
        assert 0 not in ids, "byte fallback must avoid <unk>"
        assert tok.decode(ids) == text


def test_train_refuses_impossible_vocab_with_one_line(tmp_path):
    """Catches: SentencePiece's multi-line RuntimeError escaping as a traceback, or a refusal
    that does not say how many entries the text yields."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "tiny corpus"}) + "\n")
    with pytest.raises(UserError, match=r"the text yields only \d+ vocabulary entries, "
                                        "--vocab-size 5000 asked") as info:
        train_tokenizer([str(src)], tmp_path / "t", vocab_size=5000, num_threads=1)
    assert "\n" not in str(info.value)
    assert not list(tmp_path.glob("t.*")) and not list(tmp_path.glob(".t.*"))


@pytest.mark.slow
def test_byte_bpe_refuses_a_vocabulary_the_text_cannot_fill(tmp_path, cli):
    """Catches: ``--kind byte-bpe`` writing a tokenizer.json with fewer entries than
    --vocab-size (the trainer runs out of pairs to merge) and exiting 0 without a word, while
    SentencePiece refuses the same text."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"the quick brown fox {i}"}) + "\n"
                           for i in range(50)))
    result = cli("train-tokenizer", src, "--kind", "byte-bpe", "--vocab-size", "5000",
                 "--output", tmp_path / "bpe", "--quiet")  # the error alone on stderr
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    yielded = int(re.search(r"yields only ([\d,]+) vocabulary", line).group(1).replace(",", ""))
    assert 300 < yielded < 5000 and f"--vocab-size {yielded} or less" in line
    assert not (tmp_path / "bpe").exists()
    # asking for what it yields works: that many entries, exactly
    result = cli("train-tokenizer", src, "--kind", "byte-bpe", "--vocab-size", str(yielded),
                 "--output", tmp_path / "bpe")
    assert result.returncode == 0, result.stderr
    assert load_tokenizer(tmp_path / "bpe").vocab_size == yielded


def test_train_samples_a_bounded_number_of_lines(tmp_path):
    """Catches: max_sentences ignored (memory growing with the input)."""
    import bloomline.dataprep.tokenizer.training as module

    seen = []
    real_reservoir = module._reservoir

    def spy(items, size, seed):
        sample = real_reservoir(items, size, seed)
        seen.append(len(sample))
        return sample

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"line {i} with some words\nsecond {i}"}) + "\n"
                           for i in range(3000)))
    module._reservoir, original = spy, module._reservoir
    try:
        train_tokenizer([str(src)], tmp_path / "t", vocab_size=300, max_sentences=1000,
                        num_threads=1)
    finally:
        module._reservoir = original
    assert seen == [1000]  # 6000 lines offered, 1000 kept
    assert load_tokenizer(tmp_path / "t.model").vocab_size == 300


def test_reservoir_is_uniform_enough_and_deterministic():
    """Catches: a 'sample' that is just the first N lines (biased towards the first files)."""
    from bloomline.dataprep.tokenizer.training import _reservoir

    sample = _reservoir(iter(range(100_000)), 1000, seed=3)
    assert sample == _reservoir(iter(range(100_000)), 1000, seed=3)
    assert sum(x >= 50_000 for x in sample) in range(430, 571)  # ~500 expected from each half
