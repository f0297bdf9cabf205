"""Tiny corpora for the inspection tools, and ``inspect-data`` run in-process.

The tokenizer is the session's ``tiny_tokenizer`` (root ``conftest.py``, 512 pieces); the
corpora are written with dataprep's own writer, as ``dataprep tokenize`` would: ids of each
text followed by the EOD id, one sequence per document.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter, Tokenizer, load_tokenizer
from bloomline.tools.cli import main

TEXTS = [
    "Return the number of items in the container.",
    "The quick brown fox jumps over the lazy dog, again and again and again.",
    "def tokenize(text): return text.split()",
    "Memory-mapped token files in Megatron's format hold one sequence per document.",
    "Emoji are not in the vocabulary: 🦜🦩 so they fall back to bytes.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
]


def _texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(TEXTS), size=(count, 4))
    repeats = rng.integers(1, 6, size=count)
    return [" ".join(TEXTS[i] for i in row) * int(r) for row, r in zip(picks, repeats,
                                                                      strict=True)]


def write_token_file(prefix: Path, tokenizer: Tokenizer, texts: list[str],
                     empty_at: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Write ``texts`` (+ EOD each) to ``prefix``; empty documents before the given indices.

    Returns:
        The tokens of every document, empty ones included, in file order.
    """
    documents = []
    with IndexedDatasetWriter(prefix, tokenizer.token_dtype, overwrite=True) as writer:
        for number, ids in enumerate(tokenizer.encode_batch(texts)):
            if number in empty_at:
                writer.add_document(np.zeros(0, np.int64))
                documents.append(np.zeros(0, np.int64))
            tokens = np.append(ids, tokenizer.eod_id).astype(np.int64)
            writer.add_document(tokens)
            documents.append(tokens)
    return documents


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, tiny_tokenizer) -> dict:
    """A folder with datasets ``a`` (40 documents + 2 empty) and ``b`` (25 documents)."""
    folder = tmp_path_factory.mktemp("inspect") / "corpus"
    tokenizer = load_tokenizer(tiny_tokenizer)
    docs_a = write_token_file(folder / "a", tokenizer, _texts(40, seed=1), empty_at=(0, 17))
    docs_b = write_token_file(folder / "b", tokenizer, _texts(25, seed=2))
    return {"dir": folder, "a": folder / "a", "b": folder / "b", "docs_a": docs_a,
            "docs_b": docs_b, "tokenizer": tiny_tokenizer}


@pytest.fixture
def corpus_copy(corpus, tmp_path) -> Path:
    """A private copy of the corpus folder, to corrupt."""
    target = tmp_path / "copy"
    shutil.copytree(corpus["dir"], target, ignore=shutil.ignore_patterns(".index"))
    return target


@pytest.fixture
def inspect(capsys):
    """Run ``inspect-data ARGS`` in-process: (exit code, stdout, stderr)."""

    def run(*args) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in args])
        captured = capsys.readouterr()
        return exit_info.value.code or 0, captured.out, captured.err

    return run
