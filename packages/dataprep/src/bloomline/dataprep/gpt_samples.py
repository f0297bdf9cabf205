"""Fixed-length samples of one token file, read in Megatron's order (``GPTDataset``): ``ds[i]``
and the micro-batch read ``get_batch``.

The indices it reads are ``gpt_index.py``'s (built once, cached); this module is the reading
side, which every loader worker runs for every batch: one sample through numpy views, or a
whole batch through one compiled loop (``kernels.sample_index.gather_samples``).
"""

from __future__ import annotations

import numpy as np

from bloomline.dataprep.gpt_index import SampleIndex
from bloomline.dataprep.indexed_dataset import IndexedDataset

__all__ = ["GPTSampleDataset", "out_of_range", "sample_ids"]


class GPTSampleDataset:
    """Samples of L + 1 tokens of one token file, served in shuffle order.

    ``ds[i]`` is an int64 array: tokens from the start of sample ``shuffle_index[i]`` through
    the first token of the next one, across document boundaries, as Megatron's GPTDataset
    reads them. :meth:`get_batch` reads many samples in one call (the loader's micro-batch).
    """

    def __init__(self, dataset: IndexedDataset, index: SampleIndex,
                 add_extra_token: bool = True) -> None:
        self.dataset = dataset
        self.index = index
        self.extra = int(add_extra_token)
        self._reader: _BatchReader | None = None  # per process, made on first get_batch
        self._sample_length: int | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self._tokens(i).astype(np.int64)

    def _tokens(self, i: int) -> np.ndarray:
        """Sample i in the file's dtype: a read-only view into the ``.bin`` when it lies in
        one document, else a fresh array."""
        j = int(self.index.shuffle_index[i])
        (first, first_offset), (last, last_offset) = self.index.sample_index[j : j + 2].tolist()
        docs = self.index.document_index
        if first == last:
            return self.dataset.get(int(docs[first]), first_offset,
                                    last_offset - first_offset + self.extra)
        parts = [self.dataset.get(int(docs[first]), first_offset)]
        parts += [self.dataset[int(docs[k])] for k in range(first + 1, last)]
        parts.append(self.dataset.get(int(docs[last]), 0, last_offset + self.extra))
        return np.concatenate(parts)

    def get_batch(self, indices) -> np.ndarray:
        """Samples ``indices`` as one ``(len(indices), L + 1)`` array in the file's token dtype
        (uint16 or int32): row r holds the values of ``ds[indices[r]]``.

        One call per micro-batch: one compiled loop (``kernels.sample_index.gather_samples``) copies
        every sample's document runs straight into the batch, where ``ds[i]`` pays a dozen
        numpy calls per sample.

        Raises:
            IndexError: naming the first index outside ``-len(ds) .. len(ds) - 1``.
        """
        ids = sample_ids(indices)
        batch = np.empty((len(ids), self.sample_length), dtype=self.dataset.dtype)
        self.batch_reader().gather(ids, batch)
        return batch

    def batch_reader(self) -> _BatchReader:
        """This process's reader for :meth:`get_batch` (made on first use)."""
        if self._reader is None:
            self._reader = _BatchReader(self)
        return self._reader

    @property
    def sample_length(self) -> int:
        """Tokens per sample: L + 1 (L without the extra token)."""
        if self._sample_length is None:
            self._sample_length = len(self[0])
        return self._sample_length

    def __getstate__(self) -> dict:
        # the reader holds a memory map: each process (a DataLoader worker) makes its own
        return {**self.__dict__, "_reader": None}


_ALL_ROWS = np.empty(0, dtype=np.intp)  # the kernel's rows for row r = ids[r]


def sample_ids(indices) -> np.ndarray:
    """``indices`` (a sequence or 1-D array of ints) as an intp array.

    Raises:
        TypeError: for indices that are not one-dimensional integers.
        IndexError: for an unsigned index beyond any dataset's length.
    """
    ids = np.asarray(indices)
    if ids.ndim != 1:
        raise TypeError(f"sample indices must be one-dimensional, got shape {ids.shape}")
    if ids.dtype != np.intp:
        if len(ids) and ids.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got {ids.dtype}")
        if ids.dtype.kind == "u" and len(ids) and int(ids.max()) > np.iinfo(np.intp).max:
            raise IndexError(f"sample index {int(ids.max())} is out of range")
        ids = ids.astype(np.intp)
    return ids


def out_of_range(index: int, num_samples: int) -> IndexError:
    return IndexError(f"sample index {index} is out of range for {num_samples} samples")


def _plain(array: np.ndarray) -> np.ndarray:
    """``array`` as a plain ndarray view: numba takes no ``np.memmap``, and indexing one from
    Python costs more per call (its subclass hooks)."""
    return np.asarray(array).view(np.ndarray)


class _BatchReader:
    """The arrays :meth:`GPTSampleDataset.get_batch`'s compiled loop reads, as plain views,
    and the ``.bin`` mapped as an array of tokens."""

    def __init__(self, samples: GPTSampleDataset) -> None:
        # numba: imported when a batch reader is made, not by every import of this module
        from bloomline.dataprep.kernels.sample_index import gather_samples

        index, dataset = samples.index, samples.dataset
        size = dataset.bin_path.stat().st_size
        tokens = (np.memmap(dataset.bin_path, dataset.dtype, "r").view(np.ndarray) if size
                  else np.zeros(0, dataset.dtype))
        self.dtype = dataset.dtype
        self.path = dataset.bin_path
        self.num_samples = len(samples)
        self._gather = gather_samples
        self._arrays = (_plain(index.shuffle_index), _plain(index.sample_index),
                        _plain(index.document_index), _plain(dataset.sequence_pointers),
                        _plain(dataset.sequence_lengths), tokens,
                        dataset.dtype.itemsize, samples.extra)

    def gather(self, ids: np.ndarray, batch: np.ndarray, rows: np.ndarray | None = None
               ) -> None:
        """Samples ``ids`` (negative ones count from the end) into rows ``rows`` of ``batch``
        (row r for ids[r] without ``rows``).

        Raises:
            IndexError: naming the first id out of range (rows before it are written).
            ValueError: for a batch of another dtype or layout, or a sample that does not
                fill its row (an index made for another token file or L).
        """
        if batch.dtype != self.dtype or not batch.flags.c_contiguous:  # the loop copies bytes
            raise ValueError(f"batch must be C-contiguous {self.dtype}, got {batch.dtype}")
        bad = self._gather(ids, _ALL_ROWS if rows is None else rows, batch, *self._arrays)
        if bad >= 0:
            raise out_of_range(int(ids[bad]), self.num_samples)
        if bad < -1:
            raise ValueError(f"sample {int(ids[-2 - bad])} does not fill {batch.shape[1]} "
                             f"tokens of {self.path}, or its index entries point outside "
                             "it: its index was made for another token file or sequence "
                             "length, or is damaged")
