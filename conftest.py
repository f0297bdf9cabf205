"""Fixtures shared by every test folder: a tiny trained tokenizer and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Texts that stress the tokenizer's Unicode handling: Cyrillic, CJK, emoji (with a ZWJ
# sequence and a skin tone), combining marks (decomposed é, Vietnamese stacks), RTL text.
UNICODE_TEXTS = [
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "東京は日本の首都です。我们在学习中文。한국어도 있습니다.",
    "Emoji: 👩‍💻 👍🏽 🇺🇸 and 🧑‍🤝‍🧑 in a sentence.",
    "Combining: e\u0301 a\u0300 o\u0302\u0323 Tiê\u0301ng Viê\u0323t, "
    "Z\u0336a\u0336l\u0336g\u0336o.",
    "Mixed RTL: שלום עולם and مرحبا بالعالم, tabs\tand  double  spaces.",
]


def _training_lines() -> list[str]:
    base = [
        "The quick brown fox jumps over the lazy dog.",
        "Return the number of items in the container.",
        "def tokenize(text): return text.split()",
        "Memory-mapped token files in Megatron's format.",
    ]
    return [f"{line} {i}" for i in range(200) for line in base] + UNICODE_TEXTS * 20


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    """A 512-piece BPE SentencePiece model trained on a few hundred lines (~1 s)."""
    from bloomline.dataprep.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    corpus = folder / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _training_lines()),
                      encoding="utf-8")
    return train_tokenizer([str(corpus)], folder / "tiny", vocab_size=512, num_threads=1)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``dataprep ARGS`` in a fresh interpreter, as a user would, capturing output."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "bloomline.dataprep.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture
def cli():
    """The :func:`run_cli` helper as a fixture."""
    return run_cli
