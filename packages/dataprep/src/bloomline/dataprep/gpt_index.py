"""Megatron's ``GPTDataset`` indices of one token file: the split ranges, then the document,
sample and shuffle indices of each split.

Mental model (``docs/formats/megatron-data.md`` sections 2 and 3)::

    split "969,30,1" -> contiguous ranges of sequence ids (train / valid / test)
    sequence ids of a split, E epochs -> document index (ids tiled E times, shuffled)
    document index -> sample index: where each sample of L+1 tokens starts (doc position, offset)
    sample index -> shuffle index: the order in which samples are served

Everything is a pure function of (sequence lengths, split, L, requested samples, seed), drawn
from one ``numpy.random.RandomState(seed)`` in Megatron's order, so the indices are identical
to megatron-core's. Unlike Megatron's builder, the document index costs 4 bytes per (epoch,
document). Large indices are shuffled and walked by compiled loops (``kernels.sample_index``, numba:
the same draws and swaps as ``RandomState.shuffle``), small ones with numpy (the sample index
in closed form), which spares them numba's import.

Apart from the reading of samples (``gpt_samples.py``) because building is done once per
index and cached (``build_index.py``), where reading runs in every loader worker for every
batch: the two share only ``SampleIndex``, the arrays this module makes and that one reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bloomline.dataprep.setting_names import setting_error

__all__ = [
    "DEFAULT_SPLIT",
    "SPLIT_NAMES",
    "IndexShape",
    "SampleIndex",
    "build_sample_index",
    "index_shape",
    "parse_split",
    "shuffle",
    "split_sequence_ranges",
]

SPLIT_NAMES = ("train", "valid", "test")
# Megatron's --split default: train, valid, test shares of each dataset
DEFAULT_SPLIT = "969,30,1"
# Megatron builds the last epoch's samples apart when fewer than this share of an epoch is
# needed from it, so that a partial last epoch is not mixed into the global shuffle.
_SEPARATE_LAST_EPOCH_THRESHOLD = 0.80


def parse_split(split: str) -> tuple[float, float, float]:
    """``"969,30,1"`` -> normalized (train, valid, test) weights, padded with zeros.

    Raises:
        SettingError: about ``split`` (``--split``) for anything but one to three non-negative
            numbers with a positive sum.
    """
    usage = "expected up to three non-negative numbers, e.g. 969,30,1"
    try:
        values = [float(part) for part in split.split(",")]
    except ValueError:
        raise _split_error(split, usage) from None
    if not 1 <= len(values) <= 3 or any(not math.isfinite(v) or v < 0 for v in values):
        raise _split_error(split, usage)
    if sum(values) <= 0:
        raise _split_error(split, "the weights must not all be zero")
    values += [0.0] * (3 - len(values))
    weights = np.array(values, dtype=np.float64)
    return tuple((weights / weights.sum()).tolist())


def _split_error(split: str, problem: str):
    return setting_error("split", "{setting} {value!r}: " + problem, value=split)


def split_sequence_ranges(num_sequences: int, weights: tuple[float, ...]
                          ) -> dict[str, range]:
    """The contiguous sequence ids of each split with a non-zero weight.

    Bookends are cumulative sums in float64, in order, and ``round`` is Python's (half to
    even), exactly as megatron-core computes them: a different rounding would move a sequence
    from one split to another.
    """
    bounds = [0.0]
    for weight in weights:
        bounds.append(bounds[-1] + weight)
    ranges = {}
    for name, lo, hi in zip(SPLIT_NAMES, bounds[:-1], bounds[1:], strict=False):
        if hi > lo:
            ranges[name] = range(int(round(lo * float(num_sequences))),
                                 int(round(hi * float(num_sequences))))
    return ranges


@dataclass(frozen=True)
class SampleIndex:
    """The three indices of one dataset split (see the module docstring).

    Attributes:
        document_index: int32 sequence ids, ``num_epochs`` times each, shuffled.
        sample_index: ``(num_built + 1, 2)``: row j is (position in ``document_index``, token
            offset) where sample j starts; sample j ends on the first token of sample j + 1.
        shuffle_index: the order in which built samples are served.
    """

    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray
    num_epochs: int
    num_tokens_per_epoch: int
    separate_last_epoch: bool

    def __len__(self) -> int:
        return len(self.shuffle_index)


def _num_epochs(num_tokens_per_epoch: int, seq_length: int, num_samples: int | None,
                extra: int) -> int:
    if num_samples is None:
        return 1
    # exact integers: Megatron's loop is equivalent, its float sample counts are not
    requested = num_samples * seq_length + extra
    return max(1, -(-requested // num_tokens_per_epoch))


@dataclass(frozen=True)
class IndexShape:
    """The sizes of one split's indices, known before any is built (from counts alone), so a
    request too large for the machine is refused before it allocates anything."""

    num_epochs: int
    num_built: int  # samples built (the shuffle index's length)
    num_before_last: int  # samples of the epochs shuffled together
    separate_last_epoch: bool
    document_entries: int  # num_epochs * sequences
    document_itemsize: int
    sample_itemsize: int
    shuffle_itemsize: int

    @property
    def array_bytes(self) -> dict[str, int]:
        """Bytes of each array, as stored in the cache."""
        return {"document_index": self.document_entries * self.document_itemsize,
                "sample_index": (self.num_built + 1) * 2 * self.sample_itemsize,
                "shuffle_index": self.num_built * self.shuffle_itemsize}

    @property
    def build_bytes(self) -> int:
        """Memory the build holds at its peak: every array, and the shuffle index twice when
        its last epoch is shuffled apart (the two parts are concatenated)."""
        shuffle_copy = self.array_bytes["shuffle_index"] if self.separate_last_epoch else 0
        return sum(self.array_bytes.values()) + shuffle_copy


def index_shape(tokens_per_epoch: int, num_sequences: int, last_sequence_id: int,
                longest_sequence: int, seq_length: int, num_samples: int | None,
                add_extra_token: bool = True) -> IndexShape:
    """The shape of the indices ``build_sample_index`` makes for a split of
    ``num_sequences`` sequences (ids up to ``last_sequence_id``, the longest of
    ``longest_sequence`` tokens) holding ``tokens_per_epoch`` tokens: pure arithmetic."""
    extra = int(add_extra_token)
    num_epochs = _num_epochs(tokens_per_epoch, seq_length, num_samples, extra)
    num_built = (num_epochs * tokens_per_epoch - extra) // seq_length
    separate = False
    num_before_last = num_built
    if num_epochs > 1:
        num_before_last = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_length
        per_epoch = (tokens_per_epoch - extra) // seq_length
        separate = (num_samples - num_before_last
                    < int(_SEPARATE_LAST_EPOCH_THRESHOLD * per_epoch))
    int32_max = np.iinfo(np.int32).max
    entries = num_epochs * num_sequences
    return IndexShape(
        num_epochs, num_built, num_before_last, separate, entries,
        document_itemsize=4 if last_sequence_id <= int32_max else 8,
        sample_itemsize=4 if entries <= int32_max and longest_sequence <= int32_max else 8,
        shuffle_itemsize=4 if num_built < np.iinfo(np.uint32).max - 1 else 8)


def _document_index(sequence_ids: np.ndarray, num_epochs: int, rng: np.random.RandomState,
                    separate_last_epoch: bool) -> np.ndarray:
    """The split's ids tiled ``num_epochs`` times and shuffled (the last epoch apart when
    ``separate_last_epoch``), in one int32 array: 4 bytes per (epoch, document) at peak, where
    Megatron's ``mgrid`` costs 16. int64 only for a file of more than 2**31 sequences."""
    fits = len(sequence_ids) == 0 or sequence_ids[-1] <= np.iinfo(np.int32).max
    index = np.empty(num_epochs * len(sequence_ids), dtype=np.int32 if fits else np.int64)
    index.reshape(num_epochs, len(sequence_ids))[:] = sequence_ids  # broadcast, no temporary
    if not separate_last_epoch or num_epochs == 1:
        shuffle(rng, index)
    else:
        # shuffling views in place draws from the RNG exactly as shuffling separate arrays
        shuffle(rng, index[: (num_epochs - 1) * len(sequence_ids)])
        shuffle(rng, index[(num_epochs - 1) * len(sequence_ids) :])
    return index


# From this many entries the compiled loops (``kernels.sample_index``) run instead of numpy's:
# below it numpy takes less time than importing numba (docs/perf/dataprep-index-kernels.md).
_COMPILED_FROM = 1 << 20


def shuffle(rng: np.random.RandomState, array: np.ndarray) -> None:
    """``rng.shuffle(array)`` for a contiguous 1-D array, leaving ``rng`` in the state that
    leaves: the same permutation, faster for large arrays (``kernels.sample_index``)."""
    if not _COMPILED_FROM <= len(array) < 1 << 32:
        rng.shuffle(array)
        return
    # numba: imported for large arrays only (see _COMPILED_FROM)
    from bloomline.dataprep.kernels.sample_index import shuffle_mt19937

    name, key, pos, has_gauss, gauss = rng.get_state(legacy=True)
    key = np.array(key, dtype=np.uint32)  # a writable copy the kernel advances
    pos = shuffle_mt19937(array, key, int(pos))
    rng.set_state((name, key, pos, has_gauss, gauss))


def _sample_starts(sequence_lengths: np.ndarray, document_index: np.ndarray, seq_length: int,
                   num_built: int, block: int = 1 << 20, extra: int = 1) -> np.ndarray:
    """Closed form of Megatron's ``build_sample_idx``: sample j starts at token j * L.

    Row j = (k, j * L - tokens before position k) where position k of the document index
    holds token j * L. Position k holds tokens [end_k - len_k, end_k), so the samples that
    start in it number ceil(end_k / L) - ceil(end_{k-1} / L): ``np.repeat`` of the positions
    by those counts gives every row's k in one linear pass (no search, no loop over samples).

    The document index is walked in blocks of ``block`` positions, so the int64 temporaries
    cost ~40 bytes per block entry, not per (epoch, document); blocks of 1M entries (8 MB
    arrays) stay under glibc's mmap threshold once it has adapted, so the allocator reuses
    their pages instead of faulting fresh ones in for every block. Rows are written straight
    into int32 when every position and offset fits, as Megatron's are.
    """
    num_rows = num_built + 1
    int32_max = np.iinfo(np.int32).max
    fits = (len(document_index) <= int32_max
            and int(sequence_lengths.max(initial=0)) <= int32_max)
    rows = np.empty((num_rows, 2), dtype=np.int32 if fits else np.int64)
    if len(document_index) >= _COMPILED_FROM:  # Megatron's loop, compiled
        # numba: imported for large indices only (see _COMPILED_FROM)
        from bloomline.dataprep.kernels.sample_index import sample_starts

        sample_starts(sequence_lengths, document_index, seq_length, rows, extra)
        return rows
    done = 0  # rows placed so far
    tokens_before = 0  # tokens in the blocks already walked
    starts_before = 0  # samples starting in those blocks: ceil(tokens_before / L)
    for block_start in range(0, len(document_index), block):
        lengths = sequence_lengths[document_index[block_start : block_start + block]]
        ends = np.cumsum(lengths, dtype=np.int64)  # exclusive end of each position, in tokens
        ends += tokens_before
        tokens_before = int(ends[-1])
        if extra:  # a start on a document's end belongs to the next position: ceil(end / L)
            starts_upto = ends + (seq_length - 1)
            starts_upto //= seq_length
        else:  # Megatron's loop keeps it on the ending one, as (k, len_k): end // L + 1
            starts_upto = ends // seq_length
            starts_upto += 1
        counts = np.diff(starts_upto, prepend=starts_before)
        starts_before = int(starts_upto[-1])
        k = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
        upto = min(num_rows, done + len(k))
        k = k[: upto - done]
        rows[done:upto, 0] = k + block_start
        rows[done:upto, 1] = (np.arange(done, upto, dtype=np.int64) * seq_length
                              - (ends[k] - lengths[k]))
        done = upto
        if done == num_rows:
            break
    return rows


def _shuffle_index(num_first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_first, dtype=dtype)
    shuffle(rng, first)
    if num_first == total:
        return first
    last = np.arange(num_first, total, dtype=dtype)
    shuffle(rng, last)
    return np.concatenate((first, last))


def build_sample_index(sequence_lengths: np.ndarray, sequence_ids: np.ndarray | range,
                       seq_length: int, num_samples: int | None, seed: int,
                       add_extra_token: bool = True) -> SampleIndex:
    """Megatron's GPTDataset indices for the given sequences (one split of one dataset).

    Args:
        sequence_lengths: token count of every sequence of the file.
        sequence_ids: the split's sequence ids.
        seq_length: L; samples are L + 1 tokens with ``add_extra_token``.
        num_samples: samples requested (None: one epoch). More are built (the last epoch is
            filled), never fewer.
        seed: the RandomState seed.

    Raises:
        SettingError: about ``seq_length`` when L < 1 or the split holds too few tokens for
            one sample.
    """
    if seq_length < 1:
        raise setting_error("seq_length", "{setting} {value}: must be at least 1",
                            value=seq_length)
    extra = int(add_extra_token)
    if isinstance(sequence_ids, range):  # np.asarray would iterate it in Python
        sequence_ids = np.arange(sequence_ids.start, sequence_ids.stop, sequence_ids.step)
    sequence_ids = np.asarray(sequence_ids, dtype=np.int64)
    tokens_per_epoch = int(np.asarray(sequence_lengths)[sequence_ids].sum(dtype=np.int64))
    if tokens_per_epoch < seq_length + extra:
        raise setting_error("seq_length", "split of {sequences} sequences holds {tokens} "
                            "tokens, too few for one sample of {needed}; lower {setting} or "
                            "give the split a larger share", sequences=len(sequence_ids),
                            tokens=tokens_per_epoch, needed=seq_length + extra)
    shape = index_shape(tokens_per_epoch, len(sequence_ids), 0, 0, seq_length, num_samples,
                        add_extra_token)
    num_epochs, num_built = shape.num_epochs, shape.num_built
    separate, num_before_last = shape.separate_last_epoch, shape.num_before_last
    rng = np.random.RandomState(seed)
    document_index = _document_index(sequence_ids, num_epochs, rng, separate)
    sample_index = _sample_starts(np.asarray(sequence_lengths), document_index, seq_length,
                                  num_built, extra=extra)
    shuffle_index = _shuffle_index(num_before_last if separate else num_built, num_built, rng)
    return SampleIndex(document_index, sample_index, shuffle_index, num_epochs,
                       tokens_per_epoch, separate)
