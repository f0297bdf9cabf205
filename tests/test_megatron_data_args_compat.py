"""Megatron's data arguments (--data-path, --per-split-data-args-path) against megatron-core's
BlendedMegatronDatasetBuilder given the same prefixes as ``blend`` / ``blend_per_split``.

Runs when megatron-core is installed (`requirements-compat.txt`, installed by `make test`).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter, IndexRequest
from bloomline.dataprep.data_args import data_args
from bloomline.dataprep.data_args_build import build_sample_datasets

SEQ_LENGTH, SEED = 16, 1234


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    """Four token files in three folders, two of them with the stem ``train``."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(11)
    made = []
    for relative, count in (("code/train", 400), ("docs/train", 150), ("web/crawl", 90),
                            ("web/books", 60)):
        prefix = root / relative
        prefix.parent.mkdir(exist_ok=True)
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            for length in rng.integers(1, 70, size=count):
                writer.add_document(rng.integers(4, 1000, size=int(length)))
        made.append(str(prefix))
    return made


def _theirs(megatron, cache, sizes, **blend):
    gpt, builder = megatron.gpt, megatron.builder
    config = gpt.GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ_LENGTH, path_to_cache=str(cache),
        tokenizer=megatron.tokenizer(), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, **blend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder.BlendedMegatronDatasetBuilder(
            gpt.GPTDataset, sizes, lambda: True, config).build()


def _same(mine, theirs, split: str) -> int:
    """Assert that two splits serve the same samples; the number compared."""
    assert len(mine) == len(theirs), split
    if hasattr(theirs, "dataset_index"):  # a blend: which dataset and sample per position
        np.testing.assert_array_equal(mine.dataset_index, theirs.dataset_index, split)
        np.testing.assert_array_equal(mine.dataset_sample_index, theirs.dataset_sample_index,
                                      split)
        for i in range(0, len(mine), max(1, len(mine) // 40)):
            d, s = mine.source(i)
            expected, _ = theirs.datasets[d]._query_document_sample_shuffle_indices(s)
            np.testing.assert_array_equal(mine[i], expected, split)
    else:
        for i in range(min(len(mine), 200)):
            expected, _ = theirs._query_document_sample_shuffle_indices(i)
            np.testing.assert_array_equal(mine[i], expected, split)
    return len(mine)


def _sizes(request: IndexRequest) -> list[int | None]:
    return [request.train_samples, request.valid_samples, request.test_samples]


@pytest.mark.parametrize("words", [
    "0.5 {0} 0.3 {1} 0.2 {2}",   # weighted, two folders, equal stems (code/train, docs/train)
    "{0} {1} {2} {3}",           # no weights: one epoch each, by size
    "1.0 {2}",                   # one weighted prefix: megatron-core blends it (with surplus)
])
def test_data_path_identical_to_megatron_core(tmp_path, megatron, prefixes, words):
    """Bug: --data-path's prefixes from different folders, weighted or not (or one weighted
    prefix, which megatron-core blends), serve another sample order than megatron-core's
    builder given the same words through its own get_blend_from_list: another dataset or
    sample at some blend position, or other tokens."""
    utils = megatron.utils
    text = words.format(*prefixes)
    weighted = text.startswith("0.5") or text.startswith("1.0")
    request = IndexRequest(seq_length=SEQ_LENGTH, split="90,8,2", seed=SEED,
                           train_samples=2000, valid_samples=150 if weighted else None,
                           test_samples=30 if weighted else None)
    theirs = _theirs(megatron, tmp_path / "mcore", _sizes(request), split=request.split,
                     blend=utils.get_blend_from_list(text.split()))
    mine = build_sample_datasets(data_args(text), request, cache_dir=tmp_path / "ours").splits
    for number, split in enumerate(("train", "valid", "test")):
        assert _same(mine[split], theirs[number], split) > 0


def test_per_split_file_identical_to_megatron_core(tmp_path, megatron, prefixes):
    """Bug: a --per-split-data-args-path file built otherwise than megatron-core's
    blend_per_split: a split cut by --split instead of each dataset used whole, a split of one
    prefix blended, or weights applied where megatron-core uses sizes."""
    utils = megatron.utils
    spec = {"train": f"0.6 {prefixes[0]} 0.4 {prefixes[1]}",   # one string, as pasted
            "valid": [prefixes[2]],                             # one prefix: no blend
            "test": [prefixes[2], prefixes[3]]}                 # by size, exhaustive
    path = tmp_path / "splits.json"
    path.write_text(json.dumps(spec))
    request = IndexRequest(seq_length=SEQ_LENGTH, train_samples=1500, valid_samples=None,
                           test_samples=None, seed=SEED)
    blend_per_split = [utils.get_blend_from_list(
        spec[s].split() if isinstance(spec[s], str) else spec[s]) for s in spec]
    theirs = _theirs(megatron, tmp_path / "mcore", _sizes(request),
                     blend_per_split=blend_per_split)
    args = data_args(per_split_data_args_path=str(path))
    mine = build_sample_datasets(args, request, cache_dir=tmp_path / "ours").splits
    for number, split in enumerate(("train", "valid", "test")):
        assert _same(mine[split], theirs[number], split) > 0
    assert not hasattr(mine["valid"], "dataset_index")  # one prefix, whole: no blend
