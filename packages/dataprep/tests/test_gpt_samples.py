"""Megatron's GPTDataset rules for one dataset: splits, epochs, the three indices, samples."""

from __future__ import annotations

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter
from bloomline.dataprep.gpt_samples import (
    GPTSampleDataset,
    _sample_starts,
    build_sample_index,
    parse_split,
    split_sequence_ranges,
)


def test_split_ranges_by_hand():
    """Catches: splits that round differently from Megatron and move sequences across."""
    assert parse_split("969,30,1") == (0.969, 0.03, 0.001)
    assert split_sequence_ranges(1000, parse_split("969,30,1")) == {
        "train": range(0, 969), "valid": range(969, 999), "test": range(999, 1000)}
    # padded with zeros; a zero-width split is absent
    assert split_sequence_ranges(10, parse_split("8,2")) == {
        "train": range(0, 8), "valid": range(8, 10)}
    # Python's round: 2.5 -> 2 (half to even), as megatron-core computes it
    assert split_sequence_ranges(5, parse_split("1,1"))["train"] == range(0, 2)


@pytest.mark.parametrize("bad", ["", "a,b", "1,2,3,4", "-1,2", "0,0,0", "nan"])
def test_malformed_split_names_the_flag(bad):
    """Catches: a malformed --split parsed into something (Megatron's regex accepts 'a1b')."""
    with pytest.raises(UserError, match="--split"):
        parse_split(bad)


def test_sample_index_by_hand():
    """Catches: off-by-one in where samples start (each sample is L+1 tokens and the next
    starts on its last token)."""
    lengths = np.array([3, 5, 2], dtype=np.int32)
    # documents in order 0, 1, 2: tokens 0-2 | 3-7 | 8-9; L = 4 -> samples start at 0, 4, 8
    rows = _sample_starts(lengths, np.array([0, 1, 2], dtype=np.int32), seq_length=4,
                          num_built=2)
    assert rows.tolist() == [[0, 0], [1, 1], [2, 0]]
    assert rows.dtype == np.int32


def _write(tmp_path, lengths, name="d"):
    rng = np.random.default_rng(7)
    with IndexedDatasetWriter(tmp_path / name, np.uint16) as writer:
        for length in lengths:
            writer.add_document(rng.integers(3, 1000, size=length))
    return IndexedDataset(tmp_path / name)


def test_samples_by_hand(tmp_path):
    """Catches: samples that skip or repeat tokens at document boundaries."""
    ds = _write(tmp_path, [3, 5, 2])
    index = build_sample_index(ds.sequence_lengths, range(3), 4, None, seed=1)
    assert index.num_epochs == 1 and len(index) == 2  # (10 - 1) // 4
    flat = np.concatenate([ds[int(d)] for d in index.document_index])
    samples = GPTSampleDataset(ds, index)
    for i in range(len(samples)):
        j = int(index.shuffle_index[i])
        np.testing.assert_array_equal(samples[i], flat[4 * j : 4 * j + 5])


@pytest.mark.parametrize(("num_samples", "separate"), [(5, True), (8, False)])
def test_separate_last_epoch(tmp_path, num_samples, separate):
    """Catches: the last partial epoch mixed into the global shuffle (or kept apart when
    Megatron mixes it): T = 20, L = 4 -> 4 samples per epoch; 5 samples need 1 from the 2nd
    epoch (< int(0.8 * 4) = 3: separate), 8 need 4 (not separate)."""
    ds = _write(tmp_path, [10, 10])
    index = build_sample_index(ds.sequence_lengths, range(2), 4, num_samples, seed=3)
    assert index.num_epochs == 2 and len(index) == (40 - 1) // 4
    assert index.separate_last_epoch == separate
    if separate:
        assert sorted(index.shuffle_index[:4]) == [0, 1, 2, 3]
        assert sorted(index.shuffle_index[4:]) == [4, 5, 6, 7, 8]
        assert sorted(index.document_index[:2]) == [0, 1]
        assert sorted(index.document_index[2:]) == [0, 1]
    assert sorted(index.shuffle_index) == list(range(9))


def test_properties_over_many_epochs(tmp_path):
    """Catches: a document seen more or less than once per epoch, or samples of the wrong
    length."""
    rng = np.random.default_rng(0)
    ds = _write(tmp_path, rng.integers(1, 60, size=200))
    ids = range(20, 180)
    index = build_sample_index(ds.sequence_lengths, ids, 32, 2000, seed=1234)
    assert index.document_index.dtype == np.int32
    counts = np.bincount(index.document_index, minlength=ds.num_documents)
    assert set(counts[20:180]) == {index.num_epochs} and counts[:20].sum() == 0
    samples = GPTSampleDataset(ds, index)
    assert len(samples) >= 2000
    assert {len(samples[i]) for i in range(0, len(samples), 7)} == {33}


def test_too_small_and_bad_length_are_named(tmp_path):
    """Catches: an empty index (or a numpy error) instead of saying what is too small."""
    ds = _write(tmp_path, [3, 2])
    with pytest.raises(UserError, match="too few for one sample of 9"):
        build_sample_index(ds.sequence_lengths, range(2), 8, None, seed=1)
    with pytest.raises(UserError, match="--seq-length 0"):
        build_sample_index(ds.sequence_lengths, range(2), 0, None, seed=1)


def test_identical_to_megatron_core(tmp_path):
    """Catches: any difference from megatron-core's GPTDataset indices or sample tokens
    (the promise that a Megatron user's sample order carries over unchanged)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpt = pytest.importorskip("megatron.core.datasets.gpt_dataset")
        mcore_indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
        from megatron.core.datasets.utils import Split

    class _Tokenizer:  # what GPTDatasetConfig needs of a tokenizer
        eod, pad, vocab_size = 2, 3, 1000
        unique_identifiers = {"name": "test"}

    rng = np.random.default_rng(5)
    ours = _write(tmp_path, rng.integers(1, 80, size=300))
    theirs = mcore_indexed.IndexedDataset(str(tmp_path / "d"))
    weights = parse_split("90,8,2")
    ranges = split_sequence_ranges(len(ours), weights)
    cases = [("train", 64, None, 11), ("train", 50, 3000, 1234), ("train", 50, 1030, 1234),
             ("valid", 16, 500, 7), ("test", 8, None, 99)]
    for split_name, seq_length, num_samples, seed in cases:
        config = gpt.GPTDatasetConfig(
            random_seed=seed, sequence_length=seq_length, split="90,8,2",
            path_to_cache=str(tmp_path / "mcore_cache"), tokenizer=_Tokenizer(),
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        ids = ranges[split_name]
        reference = gpt.GPTDataset(theirs, str(tmp_path / "d"),
                                   np.arange(ids.start, ids.stop, dtype=np.int32),
                                   num_samples, getattr(Split, split_name), config)
        index = build_sample_index(ours.sequence_lengths, ids, seq_length, num_samples, seed)
        case = (split_name, seq_length, num_samples, seed)
        np.testing.assert_array_equal(index.document_index, reference.document_index, case)
        np.testing.assert_array_equal(index.sample_index, reference.sample_index, case)
        np.testing.assert_array_equal(index.shuffle_index, reference.shuffle_index, case)
        assert index.shuffle_index.dtype == reference.shuffle_index.dtype
        samples = GPTSampleDataset(ours, index)
        for i in range(0, len(samples), max(1, len(samples) // 50)):
            expected, _ = reference._query_document_sample_shuffle_indices(i)
            np.testing.assert_array_equal(samples[i], expected, case)


def test_sample_index_is_the_same_when_walked_in_blocks():
    """Catches: rows lost or shifted at the seams of the blocked walk that keeps memory at
    4 bytes per (epoch, document) on large corpora."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 50, size=500).astype(np.int32)
    document_index = rng.permutation(np.tile(np.arange(500, dtype=np.int32), 3))
    num_built = (int(lengths.sum()) * 3 - 1) // 16
    whole = _sample_starts(lengths, document_index, 16, num_built, block=len(document_index))
    for block in (1, 2, 3, 7, 64):
        np.testing.assert_array_equal(
            _sample_starts(lengths, document_index, 16, num_built, block=block), whole)


def test_last_row_without_extra_token_at_an_exact_multiple_of_l():
    """Catches: the last sample-index row left unfilled (garbage) when, without the extra
    token, the data ends exactly on a sample boundary: Megatron records (last position, its
    length) there."""
    from bloomline.dataprep.gpt_samples import build_sample_index

    index = build_sample_index(np.full(10, 8, np.int32), range(10), 16, None, 1234,
                               add_extra_token=False)
    assert index.sample_index[-1].tolist() == [9, 8]
    try:
        from megatron.core.datasets import helpers
    except ImportError:
        return
    reference = helpers.build_sample_idx(np.full(10, 8, np.int32), index.document_index, 16, 1,
                                         80, True, False)
    assert np.array_equal(index.sample_index, reference)
