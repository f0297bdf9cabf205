"""`dataprep build-index` against megatron-core's BlendedMegatronDatasetBuilder (optional oracle).

Runs when megatron-core is installed (`requirements-compat.txt`, installed by `make test`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter, IndexRequest, build_sample_datasets


def _corpus(folder, sizes=(400, 150, 90)):
    rng = np.random.default_rng(4)
    for name, count in zip("abc", sizes, strict=False):
        with IndexedDatasetWriter(folder / name, np.uint16) as writer:
            for length in rng.integers(1, 70, size=count):
                writer.add_document(rng.integers(4, 1000, size=int(length)))
    return folder


def _reference(megatron, folder, weights, sizes, seq_length, seed, split):
    gpt, builder = megatron.gpt, megatron.builder
    config = gpt.GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split=split,
        blend=([str(folder / n) for n in "abc"], weights),
        path_to_cache=str(folder / "mcore_cache"), tokenizer=megatron.tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder.BlendedMegatronDatasetBuilder(
            gpt.GPTDataset, sizes, lambda: True, config).build()


@pytest.mark.parametrize(("weights", "sizes"), [
    ([0.5, 0.3, 0.2], [3000, 200, 50]),   # weighted, multi-epoch, surplus 0.005
    ([1.0, 1.0, 7.0], [2000, 100, 10]),   # a small dataset repeated many times
    (None, [900, 40, 10]),                # by size, one epoch each, truncated to N
    (None, [10**6, None, None]),          # by size, exhaustive where no count is given
])
def test_blends_identical_to_megatron_core(tmp_path, megatron, weights, sizes):
    """Catches: any difference from megatron-core in which dataset and which of its samples
    each blend position serves, in any component's document/sample/shuffle index, or in the
    tokens of the samples."""
    folder = _corpus(tmp_path)
    seq_length, seed, split = 16, 1234, "90,8,2"
    reference = _reference(megatron, folder, weights, sizes, seq_length, seed, split)
    request = IndexRequest(seq_length=seq_length, train_samples=sizes[0],
                           valid_samples=sizes[1], test_samples=sizes[2], split=split,
                           seed=seed,
                           weights=None if weights is None else dict(zip("abc", weights,
                                                                         strict=True)))
    ours = build_sample_datasets(folder, request).splits
    for number, name in enumerate(("train", "valid", "test")):
        theirs, mine = reference[number], ours[name]
        np.testing.assert_array_equal(mine.dataset_index, theirs.dataset_index, name)
        np.testing.assert_array_equal(mine.dataset_sample_index, theirs.dataset_sample_index,
                                      name)
        for component, their_component in zip(mine.datasets, theirs.datasets, strict=True):
            for field in ("document_index", "sample_index", "shuffle_index"):
                np.testing.assert_array_equal(getattr(component.index, field),
                                              getattr(their_component, field), field)
        for i in range(0, len(mine), max(1, len(mine) // 40)):
            d, s = mine.source(i)
            expected, _ = theirs.datasets[d]._query_document_sample_shuffle_indices(s)
            np.testing.assert_array_equal(mine[i], expected)


def test_sample_count_is_exact_above_2_24_tokens(tmp_path, megatron):
    """Catches: a sample count computed in 32-bit float. megatron-core computes
    ceil(float(E*T - 1) / L) in C++ float when the last partial sample is kept; above 2**24
    tokens float32 cannot hold the count and drops a sample. With its defaults (drop the
    last partial sample) it uses integers, as we always do, so we agree there; the float path
    is the one difference we allow, and we never take it."""
    gpt = megatron.gpt
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed
    from megatron.core.datasets.utils import Split

    # T - 1 = 2**25 + 1 is not a float32 (its neighbours are 2**25 and 2**25 + 4)
    tokens = 2**25 + 2
    seq_length = 2**20
    with IndexedDatasetWriter(tmp_path / "big", np.uint16) as writer:
        writer.add_document(np.full(tokens, 7, dtype=np.uint16))
    # the reference's keep-partial path: ceil(float(T - 1) / L) counts 32, the truth is 33
    float32_ceil = int(np.ceil(np.float32(tokens - 1) / np.float32(seq_length)))
    assert (float32_ceil, -(-(tokens - 1) // seq_length)) == (32, 33)
    # the default path, ours and theirs: floor((T - 1) / L) in integers
    exact = (tokens - 1) // seq_length
    ours = build_sample_datasets(tmp_path, IndexRequest(seq_length=seq_length,
                                                        train_samples=None, split="1"))
    assert len(ours.splits["train"]) == exact == 32
    config = gpt.GPTDatasetConfig(
        random_seed=1, sequence_length=seq_length, split="1",
        path_to_cache=str(tmp_path / "mcore"), tokenizer=megatron.tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = gpt.GPTDataset(MegatronIndexed(str(tmp_path / "big")), str(tmp_path / "big"),
                                np.arange(1, dtype=np.int32), None, Split.train, config)
    assert len(theirs) == exact


def test_blend_of_100_datasets_identical_to_megatron_core(tmp_path, megatron):
    """Catches: a difference from megatron-core's builder with many datasets and skewed
    weights (our wake kernel, past its first period): which dataset and which of its samples
    each position serves, and its tokens."""
    gpt, builder = megatron.gpt, megatron.builder
    rng = np.random.default_rng(7)
    names = [f"d{n:03d}" for n in range(100)]
    for name in names:
        with IndexedDatasetWriter(tmp_path / name, np.uint16) as writer:
            for length in rng.integers(1, 40, size=int(rng.integers(3, 12))):
                writer.add_document(rng.integers(4, 1000, size=int(length)))
    # skewed (a 20x spread), yet every dataset draws >= 200 samples: megatron-core refuses a
    # blend whose +-1 sample of rounding exceeds a dataset's 0.5% surplus
    weights = np.geomspace(1.0, 20.0, len(names))
    rng.shuffle(weights)
    weights = weights.tolist()
    seq_length, seed, num_samples = 8, 1234, 150_000
    config = gpt.GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split="1",
        blend=([str(tmp_path / n) for n in names], weights),
        path_to_cache=str(tmp_path / "mcore_cache"), tokenizer=megatron.tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = builder.BlendedMegatronDatasetBuilder(
            gpt.GPTDataset, [num_samples, 0, 0], lambda: True, config).build()[0]
    request = IndexRequest(seq_length=seq_length, train_samples=num_samples,
                           valid_samples=None, test_samples=None, split="1", seed=seed,
                           weights=dict(zip(names, weights, strict=True)))
    mine = build_sample_datasets(tmp_path, request).splits["train"]
    np.testing.assert_array_equal(mine.dataset_index, theirs.dataset_index)
    np.testing.assert_array_equal(mine.dataset_sample_index, theirs.dataset_sample_index)
    for i in range(0, len(mine), len(mine) // 50):
        d, s = mine.source(i)
        expected, _ = theirs.datasets[d]._query_document_sample_shuffle_indices(s)
        np.testing.assert_array_equal(mine[i], expected)
