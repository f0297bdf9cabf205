"""Megatron's GPTDataset rules for one dataset: splits, epochs, the three indices, samples."""

from __future__ import annotations

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter, gpt_index
from bloomline.dataprep.gpt_index import (
    _sample_starts,
    build_sample_index,
    parse_split,
    split_sequence_ranges,
)
from bloomline.dataprep.gpt_samples import GPTSampleDataset


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


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "compiled"])
def test_identical_to_megatron_core(tmp_path, monkeypatch, compiled):
    """Catches: any difference from megatron-core's GPTDataset indices or sample tokens
    (the promise that a Megatron user's sample order carries over unchanged), by the numpy
    path of small indices and by the compiled loops of large ones (forced here)."""
    import warnings

    if compiled:
        monkeypatch.setattr(gpt_index, "_COMPILED_FROM", 2)

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


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_compiled_shuffle_is_randomstate_shuffle(monkeypatch, dtype):
    """Catches: a compiled shuffle that differs from ``RandomState.shuffle`` in any swap (a
    wrong mask or rejection at a power of two, a Mersenne Twister refill off by one word) or
    leaves the generator elsewhere, which would change every later draw (the shuffle index,
    the next split): Megatron's orders would no longer carry over."""
    monkeypatch.setattr(gpt_index, "_COMPILED_FROM", 2)
    rng = np.random.default_rng(3)
    # sizes around powers of two (mask changes) and past many 624-word refills
    for size in (2, 3, 4, 5, 17, 624, 1025, 4096, 4097, 70_001):
        for skip in (0, 1, 623):  # the generator's position inside its key
            seed = int(rng.integers(1 << 31))
            theirs, ours = np.random.RandomState(seed), np.random.RandomState(seed)
            for generator in (theirs, ours):
                generator.randint(1 << 30, size=skip)
            expected = np.arange(size, dtype=dtype) * 3
            got = expected.copy()
            theirs.shuffle(expected)
            gpt_index.shuffle(ours, got)
            np.testing.assert_array_equal(got, expected, f"size {size}, skip {skip}")
            assert np.array_equal(ours.randint(1 << 30, size=5), theirs.randint(1 << 30, size=5))


@pytest.mark.parametrize("extra", [1, 0])
def test_compiled_sample_starts_equal_the_closed_form(monkeypatch, extra):
    """Catches: the compiled walk of large document indices placing a sample start on the
    wrong side of a document's end (with and without the extra token), stalling on empty
    documents or at the last row."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        lengths = rng.choice([0, 0, 1, 2, 3, 5, 8, 40], size=int(rng.integers(1, 40)))
        lengths = lengths.astype(np.int32)
        if lengths.sum() < 10:
            continue
        document_index = rng.permutation(np.tile(np.arange(len(lengths), dtype=np.int32), 3))
        seq_length = int(rng.integers(1, 9))
        num_built = (int(lengths.sum()) * 3 - extra) // seq_length
        monkeypatch.setattr(gpt_index, "_COMPILED_FROM", 1 << 62)
        closed = _sample_starts(lengths, document_index, seq_length, num_built, extra=extra)
        monkeypatch.setattr(gpt_index, "_COMPILED_FROM", 1)
        compiled = _sample_starts(lengths, document_index, seq_length, num_built, extra=extra)
        np.testing.assert_array_equal(compiled, closed, (lengths, seq_length))


def test_last_row_without_extra_token_at_an_exact_multiple_of_l():
    """Catches: the last sample-index row left unfilled (garbage) when, without the extra
    token, the data ends exactly on a sample boundary: Megatron records (last position, its
    length) there."""
    from bloomline.dataprep.gpt_index import build_sample_index

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


# -- get_batch: many samples in one call ------------------------------------------------------
def _stacked(samples, ids) -> np.ndarray:
    return np.stack([samples[int(i)] for i in ids])


def _assert_batch_is_stacked(samples, ids, dtype) -> None:
    batch = samples.get_batch(ids)
    assert batch.dtype == dtype and batch.shape == (len(ids), len(samples[0]))
    np.testing.assert_array_equal(batch, _stacked(samples, ids))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_get_batch_equals_stacked_samples_over_many_epochs(tmp_path, dtype):
    """Bug: a batched read that differs from ``ds[i]`` anywhere: the wrong window of the
    document stream, a lost or doubled token at a document boundary, the first or last
    sample, duplicates or negative indices in one batch, the last epoch (kept apart from the
    shuffle), or tokens widened/narrowed before the trainer converts them."""
    rng = np.random.default_rng(11)
    with IndexedDatasetWriter(tmp_path / "d", dtype) as writer:
        for length in rng.integers(1, 90, size=150):
            writer.add_document(rng.integers(0, 60000, size=int(length)))
    ds = IndexedDataset(tmp_path / "d")
    index = build_sample_index(ds.sequence_lengths, range(150), 32, 1200, seed=5)
    assert index.num_epochs > 3
    samples = GPTSampleDataset(ds, index)
    n = len(samples)
    batches = [[0], [n - 1], [0, n - 1, -1, -n], [7, 7, 7, 3, 7],
               rng.integers(0, n, size=64), rng.integers(-n, n, size=33),
               list(range(n))]  # every sample once: every run of every epoch
    for ids in batches:
        _assert_batch_is_stacked(samples, ids, np.dtype(dtype))
    # the indices as a numpy array of another integer type read the same
    np.testing.assert_array_equal(samples.get_batch(np.array([5, 2], dtype=np.uint32)),
                                  _stacked(samples, [5, 2]))


@pytest.mark.parametrize("add_extra_token", [True, False])
def test_get_batch_across_many_short_and_empty_documents(tmp_path, add_extra_token):
    """Bug: samples that span dozens of documents (one-token documents, empty documents that
    own no sequence, multi-sequence documents) read with a run dropped, repeated or cut at the
    wrong offset; without the extra token, Megatron's rows that start on a document's end
    (an empty first run) and the last row at an exact multiple of L."""
    rng = np.random.default_rng(4)
    with IndexedDatasetWriter(tmp_path / "d", np.uint16) as writer:
        lengths = rng.choice([0, 0, 1, 1, 2, 3, 40], size=400)
        writer.add_documents(rng.integers(0, 1000, size=int(lengths.sum())), lengths)
        writer.add_document(rng.integers(0, 1000, size=12), sequence_lengths=[5, 7])
    ds = IndexedDataset(tmp_path / "d")
    assert ds.num_documents > len(ds)  # some documents are empty
    index = build_sample_index(ds.sequence_lengths, range(len(ds)), 64, 300, seed=9,
                               add_extra_token=add_extra_token)
    samples = GPTSampleDataset(ds, index, add_extra_token)
    runs = np.diff(index.sample_index[:, 0]) + 1
    assert runs.max() > 20  # a sample spans dozens of documents
    ids = np.arange(len(samples))
    _assert_batch_is_stacked(samples, ids, np.dtype(np.uint16))
    _assert_batch_is_stacked(samples, rng.permutation(ids)[:50], np.dtype(np.uint16))
    # whole documents, no extra token, lengths a multiple of L: the last row is (k, len_k)
    with IndexedDatasetWriter(tmp_path / "e", np.uint16) as writer:
        for _ in range(10):
            writer.add_document(rng.integers(0, 1000, size=8))
    exact = IndexedDataset(tmp_path / "e")
    index = build_sample_index(exact.sequence_lengths, range(10), 16, None, 1234,
                               add_extra_token=False)
    samples = GPTSampleDataset(exact, index, add_extra_token=False)
    _assert_batch_is_stacked(samples, np.arange(len(samples))[::-1], np.dtype(np.uint16))


def test_get_batch_names_a_bad_index_and_reads_empty_batches(tmp_path):
    """Bug: an index past the end read as a wrapped-around or garbage sample, an error that
    does not say which index, or an empty batch that crashes instead of giving 0 rows."""
    ds = _write(tmp_path, [30, 25, 40])
    samples = GPTSampleDataset(ds, build_sample_index(ds.sequence_lengths, range(3), 8, None,
                                                      seed=1))
    n = len(samples)
    for bad, ids in ((n, [0, n, 1]), (-n - 1, [-n - 1]), (n + 5, np.array([n + 5], np.uint64))):
        with pytest.raises(IndexError, match=f"sample index {bad} is out of range for {n}"):
            samples.get_batch(ids)
    with pytest.raises(TypeError, match="integers"):
        samples.get_batch([1.0, 2.0])
    with pytest.raises(TypeError, match="one-dimensional"):
        samples.get_batch([[1, 2]])
    empty = samples.get_batch([])
    assert empty.shape == (0, 9) and empty.dtype == np.uint16


def test_get_batch_refuses_an_index_of_another_file(tmp_path):
    """Bug: the compiled copy trusting an index built for another token file and writing
    past a batch row or reading past the file's mapping (memory corruption, not an error)."""
    long = _write(tmp_path, [40, 40, 40], "long")
    short = _write(tmp_path, [40, 40, 3], "short")
    index = build_sample_index(long.sequence_lengths, range(3), 8, None, seed=1)
    wrong = GPTSampleDataset(short, index)
    with pytest.raises(ValueError, match="does not fill 9 tokens of .*short.*another token"):
        wrong.get_batch(np.arange(len(wrong)))


def _damaged(index, **arrays):
    from dataclasses import replace

    return replace(index, **{name: np.asarray(value) for name, value in arrays.items()})


def test_get_batch_cannot_be_sent_outside_its_arrays(tmp_path):
    """Bug: the compiled gather (no bounds checks) trusting the values of a damaged index:
    a shuffle entry past the sample index (uint32 2**32-1, int64 2**63-1, whose + 1 wraps),
    a sample-index row pointing before or past the document index, a document id outside
    the file or negative, an offset before or past its sequence. Each read memory outside
    the arrays or the mapped .bin (a segfault, or garbage tokens); each must be refused."""
    ds = _write(tmp_path, [30, 25, 40, 12])
    index = build_sample_index(ds.sequence_lengths, range(4), 8, 20, seed=1)
    rows = np.array(index.sample_index)
    docs = np.array(index.document_index)

    def row(position, offset, at=1):
        changed = rows.copy()
        changed[at] = (position, offset)
        return changed

    def doc(value, at=0):
        changed = docs.astype(np.int64)
        changed[at] = value
        return changed

    damages = {
        "shuffle uint32 max": dict(shuffle_index=np.array([2**32 - 1], np.uint32)),
        "shuffle int64 max": dict(shuffle_index=np.array([2**63 - 1], np.int64)),
        "shuffle past the rows": dict(shuffle_index=np.array([len(rows) - 1], np.int64)),
        "shuffle negative": dict(shuffle_index=np.array([-1], np.int64)),
        "position negative": dict(sample_index=row(-5, 0, at=0),
                                  shuffle_index=np.array([0], np.int64)),
        "position past the document index": dict(sample_index=row(len(docs) + 10**6, 0)),
        "positions going back": dict(sample_index=row(0, 0, at=2),
                                     shuffle_index=np.array([1], np.int64)),
        "document id negative": dict(document_index=doc(-1)),
        "document id past the file": dict(document_index=doc(10**9)),
        "offset negative": dict(sample_index=row(int(rows[1, 0]), -4)),
        "offset past its sequence": dict(sample_index=row(int(rows[1, 0]), 10**6)),
    }
    for name, arrays in damages.items():
        arrays.setdefault("shuffle_index", np.array([0], np.int64))
        samples = GPTSampleDataset(ds, _damaged(index, **arrays))
        samples._sample_length = 9  # (from sample 0, which may be the damaged one)
        with pytest.raises(ValueError, match="point outside it") as info:
            samples.get_batch([0])
        assert "is damaged" in str(info.value), name


def test_get_batch_after_pickling_reads_the_same(tmp_path):
    """Bug: a dataset sent to a loader worker (pickled) that carries its parent's memory map
    or reads stale arrays instead of reopening its own."""
    import pickle

    rng = np.random.default_rng(8)
    ds = _write(tmp_path, rng.integers(1, 50, size=60))
    samples = GPTSampleDataset(ds, build_sample_index(ds.sequence_lengths, range(60), 16, 500,
                                                      seed=2))
    ids = rng.integers(0, len(samples), size=20)
    before = samples.get_batch(ids)  # the reader exists now
    clone = pickle.loads(pickle.dumps(samples))
    assert clone._reader is None
    np.testing.assert_array_equal(clone.get_batch(ids), before)
