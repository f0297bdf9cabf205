"""``inspect-data sample``, ``blend`` and ``plot`` take Megatron's data arguments as
``dataprep build-index`` does (``--data-path`` over folders, ``--per-split-data-args-path``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter, IndexRequest, build_sample_datasets
from bloomline.dataprep.data_args import data_args


@pytest.fixture
def prefixes(tmp_path):
    made = []
    for seed, relative in enumerate(("code/train", "docs/train")):
        rng = np.random.default_rng(seed)
        (tmp_path / relative).parent.mkdir()
        with IndexedDatasetWriter(tmp_path / relative, np.uint16) as writer:
            for length in rng.integers(1, 40, size=80):
                writer.add_document(rng.integers(4, 1000, size=int(length)))
        made.append(str(tmp_path / relative))
    return made


def test_sample_and_blend_read_the_data_path_order(prefixes, tmp_path, inspect):
    """Bug: inspect-data refuses --data-path (or needs a corpus folder), or shows another
    sample order than the trainer's for the same words."""
    words = ["0.4", prefixes[0], "0.6", prefixes[1]]
    common = ["--data-path", *words, "--seq-length", "8", "--train-samples", "60",
              "--split", "9,1", "--data-cache-path", tmp_path / "cache"]
    train = build_sample_datasets(data_args(words), IndexRequest(
        seq_length=8, train_samples=60, split="9,1")).splits["train"]
    code, out, err = inspect("sample", "--index", 7, "--json", *common)
    assert code == 0, err
    result = json.loads(out)
    np.testing.assert_array_equal(result["tokens"], train[7])
    assert result["dataset"] == train.names[train.source(7)[0]]
    code, out, err = inspect("blend", "--json", *common)
    assert code == 0, err
    assert set(json.loads(out)["datasets"]) == {"code/train", "docs/train"}


def test_corpus_and_data_path_together_are_one_line(prefixes, inspect):
    """Bug: a folder and --data-path both given, one silently ignored."""
    code, out, err = inspect("blend", str(prefixes[0]) + "/..", "--data-path", prefixes[1],
                             "--seq-length", "8", "--train-samples", "5")
    assert code == 1 and not out
    assert err.strip().splitlines() == [err.strip()]
    assert "and --data-path: give one of them" in err
