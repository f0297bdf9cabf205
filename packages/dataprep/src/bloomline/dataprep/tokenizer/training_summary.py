"""What ``dataprep train-tokenizer`` says at the end: the vocabulary, how well it covers the
sample's characters, and the time.

Coverage is the share of the sample's characters that the vocabulary holds whole, measured by
encoding (a random part of) the sample with the trained tokenizer:

- SentencePiece: characters with a piece of their own, the rest falling back to byte pieces
  (one per UTF-8 byte) or to ``<unk>``. ``--character-coverage`` sets what it aims at.
- byte-level BPE: characters that lie whole inside one token, the rest split over tokens
  that hold parts of their bytes (nothing is unknown, but such characters cost a token per
  byte or so, as byte fallback does).

For Chinese and Japanese, whose texts use thousands of characters, both say how much of the
text the vocabulary spells only in bytes.
"""

from __future__ import annotations

import random
import time

import numpy as np

from bloomline.common.progress import format_duration
from bloomline.dataprep.tokenizer.loading import load_tokenizer
from bloomline.dataprep.tokenizer.training import SPECIAL_TOKENS, TrainedTokenizer

__all__ = ["format_training_summary", "summarize_training"]

# coverage is measured on at most this many sample lines (a random part): seconds, not minutes
_MEASURED_LINES = 100_000


def summarize_training(trained: TrainedTokenizer) -> dict:
    """The figures of the summary, as one JSON-able dict."""
    started = time.perf_counter()
    tokenizer = load_tokenizer(trained.path)
    lines = trained.sentences
    if len(lines) > _MEASURED_LINES:
        lines = random.Random(0).sample(lines, _MEASURED_LINES)
    ids = tokenizer.encode_batch(lines)
    entries = [tokenizer.token_bytes(i) or b"" for i in range(tokenizer.vocab_size)]
    text = "".join(lines)
    if trained.kind == "sentencepiece":
        uncovered = _fallback_characters(tokenizer, entries, ids)
    else:
        uncovered = _split_characters(entries, lines, ids)
    return {
        "output": str(trained.path), "kind": trained.kind, "model_type": trained.model_type,
        "vocab_size": tokenizer.vocab_size, "special": len(SPECIAL_TOKENS),
        "single_characters": _single_characters(tokenizer, entries),
        "lines_read": trained.lines_read, "lines_sampled": len(trained.sentences),
        "lines_measured": len(lines), "characters": len(text),
        "distinct_characters": len(set(text)), "uncovered_characters": uncovered,
        "coverage": 1 - uncovered / len(text) if text else 1.0,
        "character_coverage": trained.character_coverage,
        "seconds": {"reading": trained.seconds_reading, "training": trained.seconds_training,
                    "coverage": time.perf_counter() - started},
    }


def _single_characters(tokenizer, entries: list[bytes]) -> int:
    """Entries that are one character (for Chinese and Japanese: how many of their
    characters have one), byte-fallback pieces and special tokens aside."""
    aside = set(tokenizer.byte_ids()) | set(tokenizer.control_ids())
    aside |= set(tokenizer.special_ids.values())
    count = 0
    for token_id, entry in enumerate(entries):
        try:
            count += token_id not in aside and len(entry.decode("utf-8")) == 1
        except UnicodeDecodeError:
            pass
    return count


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else format_duration(seconds)


def _lead_bytes(entries: list[bytes]) -> np.ndarray:
    """Per id: whether its entry is one byte that starts a character (ASCII or a UTF-8 lead
    byte, not a continuation byte 10xxxxxx)."""
    return np.array([len(e) == 1 and (e[0] & 0xC0) != 0x80 for e in entries], dtype=bool)


def _fallback_characters(tokenizer, entries: list[bytes], ids: list[np.ndarray]) -> int:
    """Characters spelled in byte pieces (one lead byte each) or as ``<unk>``."""
    is_fallback = np.zeros(tokenizer.vocab_size, dtype=bool)
    is_fallback[tokenizer.byte_ids()] = True
    counted = is_fallback & _lead_bytes(entries)
    if "unk" in tokenizer.special_ids:
        counted[tokenizer.special_ids["unk"]] = True
    every_id = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return int(counted[every_id].sum())


def _split_characters(entries: list[bytes], lines: list[str], ids: list[np.ndarray]) -> int:
    """Characters whose bytes are cut by a token boundary (byte-level BPE: the tokens of a
    line spell its bytes exactly, in order)."""
    lengths = np.array([len(e) for e in entries], dtype=np.int64)
    every_id = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    text = np.frombuffer("".join(lines).encode("utf-8"), dtype=np.uint8)
    ends = np.cumsum(lengths[every_id])
    if not len(ends) or ends[-1] != len(text):  # not spelled byte for byte: cannot say
        return 0
    inside = ends[:-1][(text[ends[:-1]] & 0xC0) == 0x80]  # boundaries before a continuation
    # the character each such boundary cuts: the count of character starts before it
    starts_before = np.cumsum((text & 0xC0) != 0x80)
    return len(np.unique(starts_before[inside - 1]))


def format_training_summary(summary: dict) -> str:
    """The summary as a few lines for people."""
    learned = summary["vocab_size"] - summary["special"] - 256
    kind = ("SentencePiece " + summary["model_type"] if summary["kind"] == "sentencepiece"
            else "byte-level BPE")
    if summary["kind"] == "sentencepiece":
        whole, rest = "have a piece of their own", "fall back to bytes"
        target = f" (--character-coverage {summary['character_coverage']})"
    else:
        whole, rest = "lie whole in one token", "are split over tokens of their bytes"
        target = ""
    seconds = summary["seconds"]
    sampled = (f"{summary['lines_sampled']:,} lines sampled of {summary['lines_read']:,} "
               "read" if summary["lines_sampled"] < summary["lines_read"]
               else f"{summary['lines_read']:,} lines")
    measured = ("" if summary["lines_measured"] == summary["lines_sampled"]
                else f", measured on {summary['lines_measured']:,} of them")
    return "\n".join([
        f"vocabulary: {summary['vocab_size']:,} entries ({kind}): {summary['special']} special, "
        f"256 bytes, {learned:,} learned; {summary['single_characters']:,} entries are one "
        "character",
        f"sample: {sampled}, {summary['characters']:,} characters, "
        f"{summary['distinct_characters']:,} distinct{measured}",
        f"coverage: {summary['coverage']:.3%} of the sample's characters {whole}; "
        f"{summary['uncovered_characters']:,} {rest}{target}",
        f"time: {_duration(sum(seconds.values()))} (reading {_duration(seconds['reading'])}, "
        f"training {_duration(seconds['training'])}, coverage "
        f"{_duration(seconds['coverage'])})",
    ])
