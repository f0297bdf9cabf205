"""``dataprep train-tokenizer``: --character-coverage, the progress line and the summary."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from bloomline.dataprep.cli import app

# 40 frequent CJK characters and 150 that occur once each: 0.98 of the text leaves the rare out
_COMMON = [chr(0x4E00 + i) for i in range(40)]
_RARE = [chr(0x6000 + i) for i in range(150)]


def _corpus(tmp_path):
    rng = random.Random(0)
    lines = ["".join(rng.choice(_COMMON) for _ in range(60)) + " the cat sat" for _ in range(400)]
    for number, rare in enumerate(_RARE):
        lines[number] += rare
    path = tmp_path / "cjk.jsonl"
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in lines),
                    encoding="utf-8")
    return path, "".join(lines)


def _train(tmp_path, corpus, name, *options):
    result = CliRunner().invoke(app, ["train-tokenizer", str(corpus), "--vocab-size", "600",
                                      "--output", str(tmp_path / name), *options],
                                prog_name="dataprep")
    assert result.exit_code == 0, result.output
    return result


def test_character_coverage_reaches_sentencepiece_and_the_summary_says_what_it_gave(tmp_path):
    """Bug: train-tokenizer had no --character-coverage (fixed at 0.9999: Chinese and Japanese
    corpora spend vocabulary on rare characters), ran silent, and ended with `wrote PATH`
    only: no vocabulary, no coverage, no time. The option must reach SentencePiece's trainer
    (the model's trainer spec), and the summary's coverage must be what the model does: the
    characters without a piece of their own fall back to bytes."""
    model_pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    import sentencepiece as spm

    corpus, text = _corpus(tmp_path)
    counts = Counter(text.replace(" ", "\u2581"))  # SentencePiece's sign for a space
    for coverage in ("0.98", "1.0"):
        result = _train(tmp_path, corpus, f"sp{coverage}", "--character-coverage", coverage)
        model_file = tmp_path / f"sp{coverage}.model"
        proto = model_pb2.ModelProto()
        proto.ParseFromString(model_file.read_bytes())
        assert proto.trainer_spec.character_coverage == pytest.approx(float(coverage))
        processor = spm.SentencePieceProcessor(model_file=str(model_file))
        own_piece = {processor.IdToPiece(i) for i in range(processor.GetPieceSize())
                     if not processor.IsByte(i)}
        falling_back = sum(n for char, n in counts.items() if char not in own_piece)
        assert (falling_back > 0) == (coverage == "0.98")  # the rare characters
        summary = result.stdout
        assert re.search(r"^vocabulary: 600 entries \(SentencePiece bpe\)", summary, re.M)
        assert re.search(rf"^coverage: {100 * (1 - falling_back / len(text)):.3f}% of the "
                         rf"sample's characters have a piece of their own; {falling_back:,} "
                         rf"fall back to bytes \(--character-coverage {coverage}\)$",
                         summary, re.M), summary
        assert re.search(rf"^sample: 400 lines, {len(text):,} characters, {len(set(text))} "
                         "distinct$", summary, re.M), summary
        assert re.search(r"^time: [\d.]+ s \(reading [\d.]+ s, training", summary, re.M)
        assert re.search(r"^train-tokenizer: reading 100% \| 400 lines .*\| done$",
                         result.stderr, re.M), result.stderr


def test_byte_bpe_summary_counts_characters_split_over_tokens(tmp_path):
    """Bug: no summary for a byte-level BPE either, and --character-coverage (SentencePiece
    only) taken silently. Its coverage is the share of characters whole in one token: with
    100 entries above the bytes the rare CJK characters (3 bytes each) stay split."""
    corpus, text = _corpus(tmp_path)
    result = _train(tmp_path, corpus, "bpe", "--kind", "byte-bpe", "--quiet")
    found = re.search(r"^coverage: ([\d.]+)% of the sample's characters lie whole in one "
                      r"token; ([\d,]+) are split over tokens of their bytes$",
                      result.stdout, re.M)
    assert found, result.stdout
    assert int(found.group(2).replace(",", "")) >= len(_RARE)
    assert result.stderr == ""  # --quiet
    refused = CliRunner().invoke(app, ["train-tokenizer", str(corpus), "--vocab-size", "600",
                                       "--kind", "byte-bpe", "--output", str(tmp_path / "x"),
                                       "--character-coverage", "0.99"])
    assert refused.exit_code == 1 and "sentencepiece only" in str(refused.exception)
    assert not (tmp_path / "x").exists()
