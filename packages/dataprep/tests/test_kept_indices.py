"""Kept indices (``kept_indices.py``, ``IndexRequest.kept_sizes``): a train dataset's index
keeps the sample count it was built with while it holds what new phases draw from it, so its
sample order goes on; only one that needs more is sized anew; no kept sizes is today's
request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter, IndexRequest, build_sample_datasets
from bloomline.dataprep.blend_phases import BlendPhase

WEIGHTS = {"a": 0.5, "b": 0.5}
N = 200
LOWER = (BlendPhase(40, {"a": 0.1, "b": 0.9}),)  # a drawn 20 + 16: one epoch would do
RAISE = (BlendPhase(40, {"a": 0.9, "b": 0.1}),)  # a drawn 20 + 144: more than 2 epochs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """``a``: 20 documents of 50 tokens (its train split 56 samples of 16 per epoch), so the
    first request's 101 samples of it take 2 epochs; ``b``: 200 documents, one epoch."""
    folder = tmp_path_factory.mktemp("kept") / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for name, count in (("a", 20), ("b", 200)):
        with IndexedDatasetWriter(folder / name, np.uint16) as writer:
            for _ in range(count):
                writer.add_document(rng.integers(4, 1000, size=50))
    return folder


def _build(corpus, cache, phases=(), kept=()):
    request = IndexRequest(seq_length=16, train_samples=N, split="90,10,0", weights=WEIGHTS,
                           phases=phases, kept_sizes=tuple(kept))
    return build_sample_datasets(corpus, request, cache_dir=cache)


def _sizes(built) -> dict[str, int]:
    return {name: row["requested"]
            for name, row in built.report["splits"]["train"]["datasets"].items()}


def _component(built, name: str):
    train = built.splits["train"]
    return train.datasets[train.names.index(name)]


def _order(component) -> list:
    """The dataset's samples in served order, as token tuples."""
    return [tuple(component[i]) for i in range(len(component))]


def test_a_kept_size_that_suffices_keeps_the_index(corpus, tmp_path):
    """Bug: a resume that lowers a dataset's weight resizing its index to the new draw: the
    index of the new phases alone has another number of epochs, so the dataset's whole order
    is reshuffled (samples already trained come again, others never)."""
    before = _build(corpus, tmp_path)
    alone = _build(corpus, tmp_path, LOWER)
    kept = _build(corpus, tmp_path, LOWER, _sizes(before).items())
    old, new, kept_a = (_component(b, "a") for b in (before, alone, kept))
    # not vacuous: the new phases alone would build another index of a, in another order
    assert (old.index.num_epochs, new.index.num_epochs) == (2, 1)
    assert _order(new) != _order(old)[: len(new)]
    assert _sizes(kept) == _sizes(before) == {"a": 101, "b": 101}
    assert kept.report["splits"]["train"]["datasets"]["a"]["status"] == "reused"
    assert _order(kept_a) == _order(old)
    np.testing.assert_array_equal(kept_a.index.shuffle_index, old.index.shuffle_index)
    # the blend draws a from its kept index's first samples on, within what it holds
    train = kept.splits["train"]
    which = np.asarray(train.dataset_index)
    served = np.asarray(train.dataset_sample_index)[which == 0]
    np.testing.assert_array_equal(served, np.arange(len(served)))
    assert len(served) <= len(kept_a)


def test_a_kept_size_that_does_not_suffice_is_resized(corpus, tmp_path):
    """Bug: a kept index smaller than what the new phases draw being kept (the blend would
    draw past its end), or a resized one not sized as the phases alone size it."""
    before = _build(corpus, tmp_path)
    alone = _build(corpus, tmp_path, RAISE)
    kept = _build(corpus, tmp_path, RAISE, _sizes(before).items())
    assert _sizes(alone)["a"] > len(_component(before, "a"))
    assert _sizes(kept) == {"a": _sizes(alone)["a"], "b": 101}
    assert _order(_component(kept, "a")) == _order(_component(alone, "a"))


def test_no_kept_sizes_is_todays_request(corpus, tmp_path):
    """Bug: the kept sizes moving a request without them (its cache entries and sizes, which
    the megatron-core compatibility tests pin) or reaching the valid split (sized by its own
    rule, one epoch of each dataset)."""
    plain = _build(corpus, tmp_path, LOWER)
    odd = _build(corpus, tmp_path, LOWER, [("a", 101), ("b", 101), ("gone", 7)])
    assert _sizes(plain) == {"a": 37, "b": 165}
    for split in ("train", "valid"):
        rows = plain.report["splits"][split]["datasets"]
        assert all(row["status"] == "built" for row in rows.values())
    assert odd.report["splits"]["valid"] == {
        **plain.report["splits"]["valid"],
        "datasets": {name: {**row, "status": "reused"}
                     for name, row in plain.report["splits"]["valid"]["datasets"].items()},
        "blend": {**plain.report["splits"]["valid"]["blend"], "status": "reused"}}
