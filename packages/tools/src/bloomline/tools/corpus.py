"""Opening ``PREFIX|CORPUS_DIR`` read-only and reading whole token files fast.

Every subcommand reads through :class:`bloomline.dataprep.IndexedDataset` (which validates the
header and sizes on open); this module adds what the tools need on top of it: the whole
``.bin`` as one memory-mapped array walked in fixed-size chunks, per-document lengths, and
turning a token number back into (document, sequence, position) for error messages.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.build_index import find_datasets, open_token_files
from bloomline.dataprep.data_args import DataArgs
from bloomline.dataprep.indexed_dataset import CorruptTokenFileError, IndexedDataset

__all__ = [
    "CHUNK_BYTES",
    "TokenRange",
    "check_token_chunk",
    "document_lengths",
    "document_tokens",
    "iter_token_chunks",
    "locate_token",
    "map_tokens",
    "open_dataset",
    "open_datasets",
    "scan_token_range",
]

# 64 MiB per step: big enough that the per-chunk numpy call overhead vanishes, small enough
# that a chunk's temporaries (e.g. a bincount's int64 widening) stay small.
CHUNK_BYTES = 64 << 20


def open_datasets(path: str | os.PathLike | DataArgs) -> dict[str, IndexedDataset]:
    """``corpus/NAME`` (one token file), a corpus folder (every ``NAME.idx`` in it), or the
    datasets of ``--data-path`` and the like (``DataArgs``), by name.

    Raises:
        UserError: missing files or folder, a corrupt header, mixed dtypes in a folder.
    """
    if isinstance(path, DataArgs):
        return open_token_files(path.sources(), path.text)
    path = Path(path)
    if path.is_dir():
        return find_datasets(path)
    dataset = IndexedDataset(path)
    return {Path(dataset.path_prefix).name: dataset}


def open_dataset(prefix: str | os.PathLike) -> IndexedDataset:
    """One token file, index fully checked; a folder is refused with the prefixes it holds.

    Opening checks the whole index (vectorized, the index only): no subcommand ever shows
    tokens through a corrupted offset.
    """
    path = Path(prefix)
    if path.is_dir():
        names = sorted(p.stem for p in path.glob("*.idx"))
        hint = f"; it holds: {', '.join(str(path / n) for n in names[:5])}" if names else ""
        raise UserError(f"{path}: a folder; give the prefix of one token file, "
                        f"e.g. {path}/NAME{hint}")
    return IndexedDataset(path)


def map_tokens(dataset: IndexedDataset) -> np.ndarray:
    """Every token of the ``.bin`` as one read-only array over a fresh memory map.

    A private mapping advised ``MADV_SEQUENTIAL`` lets the kernel read ahead aggressively and
    drop pages behind us: it scans at page-cache speed without a copy (``readinto`` into a
    buffer was slower, the copy being the cost; docs/perf/dataprep-inspect-data.md).
    """
    size = dataset.bin_path.stat().st_size
    if size == 0:
        return np.zeros(0, dataset.dtype)
    with open(dataset.bin_path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise"):  # not on every platform
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    # IndexedDataset checked on open that the size is exactly what the index needs
    return np.frombuffer(mapped, dataset.dtype)


def iter_token_chunks(dataset: IndexedDataset, chunk_bytes: int | None = None
                      ) -> Iterator[tuple[int, np.ndarray]]:
    """(number of the chunk's first token, its tokens) for consecutive chunks of the ``.bin``.

    The ``.bin`` is the concatenation of all sequences (the index's offsets say so and
    :meth:`IndexedDataset.verify` checks it), so chunks need not follow sequence boundaries.
    ``chunk_bytes`` defaults to :data:`CHUNK_BYTES`, read at call time (tests shrink it).
    """
    tokens = map_tokens(dataset)
    step = max(1, (chunk_bytes or CHUNK_BYTES) // dataset.dtype.itemsize)
    for start in range(0, len(tokens), step):
        yield start, tokens[start : start + step]


def document_lengths(dataset: IndexedDataset) -> np.ndarray:
    """Tokens per document (int64), 0 for an empty document, in one pass over the index."""
    bounds = dataset.document_indices
    # a document is a run of sequences (empty: none), so its length is a difference of the
    # prefix sum at its boundaries; int64 because a file can hold more than 2**31 tokens
    ends = np.zeros(len(dataset) + 1, dtype=np.int64)
    np.cumsum(dataset.sequence_lengths, dtype=np.int64, out=ends[1:])
    return ends[bounds[1:]] - ends[bounds[:-1]]


def document_tokens(dataset: IndexedDataset, document: int) -> np.ndarray:
    """All tokens of document ``document`` (its sequences concatenated)."""
    num = dataset.num_documents
    if not 0 <= document < num:
        raise UserError(f"--doc {document}: {dataset.idx_path} has {num:,} documents "
                        f"(0..{num - 1})")
    first, last = dataset.document_indices[document : document + 2].tolist()
    if first == last:
        return np.zeros(0, dataset.dtype)
    return np.concatenate([dataset[i] for i in range(first, last)])


def locate_token(dataset: IndexedDataset, token_number: int) -> tuple[int, int, int]:
    """(document, sequence, position in the document) of the token'th token of the ``.bin``."""
    byte = token_number * dataset.dtype.itemsize
    sequence = int(np.searchsorted(dataset.sequence_pointers, byte, side="right")) - 1
    document = int(np.searchsorted(dataset.document_indices, sequence, side="right")) - 1
    first_sequence = int(dataset.document_indices[document])
    start = int(dataset.sequence_pointers[first_sequence]) // dataset.dtype.itemsize
    return document, sequence, token_number - start


@dataclass(frozen=True)
class TokenRange:
    """Smallest (signed dtypes only) and largest token id of a file; None when not known."""

    smallest: int | None
    largest: int | None


def check_token_chunk(dataset: IndexedDataset, start: int, chunk: np.ndarray,
                      vocab_size: int | None = None, where: str = "") -> tuple[int | None, int]:
    """(smallest id or None for unsigned dtypes, largest id) of a non-empty chunk.

    Args:
        start: the number of the chunk's first token in the file (for the error message).
        vocab_size: ids must be below it (None: only negative ids are refused).
        where: appended to the vocabulary size in the message (e.g. " of tok.model").

    Raises:
        CorruptTokenFileError: a negative id or one >= ``vocab_size``, naming its document,
            sequence and position.
    """
    largest = int(chunk.max())
    smallest = None
    if np.issubdtype(chunk.dtype, np.signedinteger):
        smallest = int(chunk.min())  # unsigned ids cannot be negative: no second pass
    too_high = vocab_size is not None and largest >= vocab_size
    if (smallest is not None and smallest < 0) or too_high:
        outside = chunk < 0
        if too_high:
            outside |= chunk >= vocab_size
        bad = int(np.flatnonzero(outside)[0])
        raise _bad_token(dataset, start + bad, int(chunk[bad]), vocab_size, where)
    return smallest, largest


def scan_token_range(dataset: IndexedDataset, vocab_size: int | None = None,
                     where: str = "") -> TokenRange:
    """Smallest and largest id over the whole ``.bin``, one chunk at a time.

    With ``vocab_size`` the scan stops at the first id outside ``[0, vocab_size)``.

    Raises:
        CorruptTokenFileError: see :func:`check_token_chunk`.
    """
    smallest, largest = None, None
    for start, chunk in iter_token_chunks(dataset):
        low, high = check_token_chunk(dataset, start, chunk, vocab_size, where)
        largest = high if largest is None else max(largest, high)
        if low is not None:
            smallest = low if smallest is None else min(smallest, low)
    return TokenRange(smallest, largest)


def _bad_token(dataset: IndexedDataset, token_number: int, value: int,
               vocab_size: int | None, where: str) -> CorruptTokenFileError:
    document, sequence, position = locate_token(dataset, token_number)
    what = ("negative" if value < 0 else
            f"not below the vocabulary size {vocab_size}{where}")
    return CorruptTokenFileError(
        f"{dataset.bin_path}: token id {value} at document {document} (sequence {sequence}), "
        f"position {position}: {what}")
