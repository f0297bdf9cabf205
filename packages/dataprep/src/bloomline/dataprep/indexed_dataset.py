"""The token-file format: Megatron's MMIDIDX ``.bin``/``.idx`` pair (version 1).

This module owns the format; everything else in bloomline (the tokenize pipeline, the sample
indices, the trainer's loader, the inspection tools) reads and writes token files through it.

Layout of ``NAME.idx`` (little-endian, no padding), see ``docs/formats/megatron-data.md``::

    magic  b"MMIDIDX\\x00\\x00" | u64 version=1 | u8 dtype code | u64 S | u64 D'
    int32[S] sequence lengths | int64[S] byte offsets into .bin | int64[D'] document boundaries

``NAME.bin`` is the raw concatenation of all sequences. A document is a run of sequences
(usually exactly one); an empty document repeats its boundary and owns no sequence, as in
Megatron's ``preprocess_data.py``.

Both the reader and the writer stream: the reader memory-maps (``ds[i]`` is a zero-copy view),
the writer appends to files and writes the index in fixed-size blocks, so neither holds a
per-document Python list.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from bloomline.common.atomic import check_can_write, publish, publish_new
from bloomline.common.errors import UserError
from bloomline.common.output_lock import OutputLock
from bloomline.dataprep.fingerprint import (
    check_same_tokenizer,
    fingerprint_path,
    write_fingerprint_record,
)

__all__ = [
    "DTYPE_CODES",
    "TOKEN_DTYPE_CODES",
    "CorruptTokenFileError",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "merge_indexed_datasets",
    "token_dtype_for_vocab",
    "write_index",
]

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, S, D'
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_CODE_OF_DTYPE = {dtype: code for code, dtype in DTYPE_CODES.items()}
# Megatron's ``DType`` enum also names float64 (6) and float32 (7): the format is generic, but
# token ids are integers, and its preprocessing writes only uint16 or int32 (as we do). A float
# code is refused for token data (a float32 file read as ids would be garbage).
TOKEN_DTYPE_CODES = frozenset(code for code, dtype in DTYPE_CODES.items()
                              if np.issubdtype(dtype, np.integer))
# Megatron switches to int32 tokens a little below 2**16 (``vocab_size < 65500``); keep the
# same threshold so files are byte-identical to what its preprocessing writes.
UINT16_VOCAB_LIMIT = 65500
_BLOCK = 1 << 20  # entries per block when streaming arrays to disk (8 MiB of int64)
_CHECK_BLOCK = 1 << 16  # entries per block of the open-time checks (512 KiB of int64)


class CorruptTokenFileError(UserError):
    """A ``.bin``/``.idx`` pair that is truncated, corrupted or not in MMIDIDX format."""


def token_dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab < 65500, Megatron's rule), else int32."""
    return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)


def _paths(path_prefix: str | os.PathLike) -> tuple[Path, Path]:
    prefix = str(path_prefix)
    for suffix in (".bin", ".idx"):
        if prefix.endswith(suffix):  # accept "corpus/NAME.idx" as well as "corpus/NAME"
            prefix = prefix[: -len(suffix)]
    return Path(prefix + ".idx"), Path(prefix + ".bin")


def _write_blocks(fh, array: np.ndarray, dtype: np.dtype) -> None:
    for start in range(0, len(array), _BLOCK):
        fh.write(np.ascontiguousarray(array[start : start + _BLOCK], dtype=dtype).tobytes())


def write_index(
    idx_path: str | os.PathLike,
    dtype: np.dtype,
    lengths: np.ndarray,
    document_indices: np.ndarray,
) -> None:
    """Write an ``.idx`` file from sequence lengths and document boundaries.

    ``lengths`` and ``document_indices`` may be memory-mapped: both are read in blocks and the
    byte offsets are accumulated block by block in int64, so memory stays bounded.
    """
    dtype = np.dtype(dtype)
    num_sequences = len(lengths)
    if len(document_indices) == 0 or int(document_indices[-1]) != num_sequences:
        raise ValueError("document_indices must end at the number of sequences")
    with open(idx_path, "wb") as fh:
        fh.write(HEADER.pack(MAGIC, VERSION, _CODE_OF_DTYPE[dtype], num_sequences,
                             len(document_indices)))
        for start in range(0, num_sequences, _BLOCK):
            block = np.asarray(lengths[start : start + _BLOCK], dtype=np.int64)
            if block.size and (block.min() < 0 or block.max() > np.iinfo(np.int32).max):
                raise ValueError("sequence lengths must fit int32")
            fh.write(block.astype(np.int32).tobytes())
        offset = 0  # bytes before the current block
        for start in range(0, num_sequences, _BLOCK):
            nbytes = np.asarray(lengths[start : start + _BLOCK], dtype=np.int64) * dtype.itemsize
            ends = np.cumsum(nbytes)
            fh.write((ends - nbytes + offset).tobytes())
            offset += int(ends[-1]) if ends.size else 0
        _write_blocks(fh, document_indices, np.dtype(np.int64))


class IndexedDataset:
    """Validating, memory-mapped reader of a ``.bin``/``.idx`` pair.

    ``ds[i]`` is sequence ``i`` as a read-only numpy view into the memory-mapped ``.bin`` (no
    copy). Opening checks the whole index, so that no reader (``ds[i]``, the compiled batch
    gather) can be sent outside the ``.bin`` by a damaged or foreign file: magic, version, an
    integer token dtype code, array sizes against the file size, document boundaries (from 0
    to S, never decreasing), lengths (never negative), byte offsets (the running sum of the
    lengths in bytes, from 0) and the ``.bin`` size (exactly where the last sequence ends).
    The array checks are vectorized numpy over the index in blocks; the ``.bin`` is not read.

    Args:
        path_prefix: ``corpus/NAME`` (``corpus/NAME.idx`` or ``.bin`` are accepted too).

    Raises:
        CorruptTokenFileError: naming the file and what is wrong with it.
        UserError: when a file is missing.
    """

    def __init__(self, path_prefix: str | os.PathLike) -> None:
        self.idx_path, self.bin_path = _paths(path_prefix)
        self.path_prefix = str(self.idx_path)[: -len(".idx")]
        for path in (self.idx_path, self.bin_path):
            if not path.is_file():
                raise UserError(f"{path}: no such file (expected a .bin/.idx pair)")
        self._open()

    def _open(self) -> None:
        idx_size = self.idx_path.stat().st_size
        with open(self.idx_path, "rb") as fh:
            header = fh.read(HEADER.size)
        bad = f"{self.idx_path}: not a valid MMIDIDX index:"
        if len(header) < HEADER.size:
            raise CorruptTokenFileError(f"{bad} {idx_size} bytes, shorter than the header")
        magic, version, code, num_seq, num_bounds = HEADER.unpack(header)
        if magic != MAGIC:
            raise CorruptTokenFileError(f"{bad} bad magic {magic!r}")
        if version != VERSION:
            raise CorruptTokenFileError(f"{bad} version {version}, only version 1 is supported")
        if code not in DTYPE_CODES:
            raise CorruptTokenFileError(f"{bad} unknown dtype code {code}")
        if code not in TOKEN_DTYPE_CODES:
            raise CorruptTokenFileError(
                f"{bad} dtype code {code} ({DTYPE_CODES[code].name}) is not an integer type; "
                "token ids must be integers (uint16 or int32 as written by dataprep and "
                "Megatron's preprocessing)")
        expected = HEADER.size + 4 * num_seq + 8 * num_seq + 8 * num_bounds
        if idx_size != expected:
            kind = "truncated" if idx_size < expected else "has trailing bytes"
            raise CorruptTokenFileError(
                f"{bad} {kind}: {idx_size} bytes but the header "
                f"({num_seq} sequences, {num_bounds} boundaries) needs {expected}"
            )
        self.dtype = DTYPE_CODES[code]
        mm = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        self._idx_mmap = mm
        offset = HEADER.size
        self.sequence_lengths = np.frombuffer(mm, np.int32, num_seq, offset)
        offset += 4 * num_seq
        self.sequence_pointers = np.frombuffer(mm, np.int64, num_seq, offset)
        offset += 8 * num_seq
        self.document_indices = np.frombuffer(mm, np.int64, num_bounds, offset)
        bin_size = self.bin_path.stat().st_size
        self._check_index(bin_size)
        # np.memmap refuses empty files; an empty corpus simply has no token buffer.
        self._bin = np.memmap(self.bin_path, np.uint8, "r") if bin_size else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.get(index)

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset:offset+length`` of sequence ``index``, a zero-copy view."""
        num = len(self)
        if index < 0:
            index += num
        if not 0 <= index < num:
            raise IndexError(f"sequence {index} out of range for {num} sequences")
        seq_len = int(self.sequence_lengths[index])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"tokens {offset}:{offset + length} out of range for length {seq_len}")
        start = int(self.sequence_pointers[index]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, self.dtype, length, start)

    @property
    def tokens(self) -> np.ndarray:
        """Every token of the ``.bin``, in file order, as one read-only array (a zero-copy
        view of the file's memory map; empty for an empty file)."""
        return np.frombuffer(self._bin, self.dtype)

    @property
    def num_documents(self) -> int:
        """Documents (boundaries - 1), counting empty ones."""
        return len(self.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        """Total tokens in ``.bin``."""
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def _check_index(self, bin_size: int) -> None:
        """The index checks of opening (see the class docstring).

        Vectorized over blocks of ``_CHECK_BLOCK`` entries into reused buffers, so that the
        temporaries stay in the CPU cache whatever the file's size: the cost is one read of
        the index (~20 bytes per sequence).

        Raises:
            CorruptTokenFileError: one line naming the file and the first bad sequence or
                document.
        """
        bad = f"{self.idx_path}: not a valid MMIDIDX index:"
        corrupt = f"{self.idx_path}: corrupted index:"
        bounds = self.document_indices
        num_seq = len(self.sequence_lengths)
        if len(bounds) < 1 or bounds[0] != 0:
            raise CorruptTokenFileError(f"{bad} document boundaries must start at 0")
        if bounds[-1] != num_seq:
            raise CorruptTokenFileError(
                f"{bad} last document boundary {int(bounds[-1])} != number of sequences "
                f"{num_seq}")
        block = _CHECK_BLOCK
        flags = np.empty(block, dtype=bool)
        for start in range(0, len(bounds) - 1, block):
            stop = min(start + block, len(bounds) - 1)  # steps into boundaries start+1..stop
            down = flags[: stop - start]
            np.less(bounds[start + 1 : stop + 1], bounds[start:stop], out=down)
            if down.any():
                document = start + int(np.argmax(down))
                raise CorruptTokenFileError(
                    f"{corrupt} document boundaries decrease at document {document} "
                    f"({int(bounds[document])} then {int(bounds[document + 1])})")
        lengths, pointers = self.sequence_lengths, self.sequence_pointers
        if num_seq and lengths.min() < 0:
            sequence = int(np.argmax(lengths < 0))
            raise CorruptTokenFileError(
                f"{corrupt} negative length {int(lengths[sequence])} at sequence "
                f"{sequence}{self._document_of(sequence)}")
        # Offsets are the running sum of the lengths in bytes: offset 0 is 0 and each step is
        # the previous sequence's size. Then every offset is >= 0 and increasing, and all lie
        # inside the .bin once the last sequence ends exactly at its size (checked last).
        if num_seq and pointers[0] != 0:
            self._bad_offset(0, 0)
        itemsize = self.dtype.itemsize
        steps, sizes = np.empty(block, dtype=np.int64), np.empty(block, dtype=np.int64)
        for start in range(0, num_seq - 1, block):
            stop = min(start + block, num_seq - 1)  # steps into sequences start+1..stop
            count = stop - start
            np.subtract(pointers[start + 1 : stop + 1], pointers[start:stop], out=steps[:count])
            np.multiply(lengths[start:stop], itemsize, out=sizes[:count], dtype=np.int64)
            wrong = np.not_equal(steps[:count], sizes[:count], out=flags[:count])
            if wrong.any():
                sequence = start + int(np.argmax(wrong)) + 1
                self._bad_offset(sequence, int(pointers[sequence - 1])
                                 + int(lengths[sequence - 1]) * itemsize)
        needed = int(pointers[-1]) + int(lengths[-1]) * itemsize if num_seq else 0
        if bin_size != needed:
            kind = "truncated" if bin_size < needed else "longer than its index says"
            raise CorruptTokenFileError(
                f"{self.bin_path}: {kind}: {bin_size} bytes, the index needs {needed}")

    def _document_of(self, sequence: int) -> str:
        """`` (document D)`` of a sequence, for messages (boundaries checked already)."""
        document = int(np.searchsorted(self.document_indices, sequence, side="right")) - 1
        return f" (document {document})"

    def _bad_offset(self, sequence: int, expected: int) -> None:
        offset = int(self.sequence_pointers[sequence])
        what = ("negative" if offset < 0 else
                f"past the end of {self.bin_path.name} ({self.bin_path.stat().st_size} bytes)"
                if offset > self.bin_path.stat().st_size else
                "not the running sum of the lengths before it")
        raise CorruptTokenFileError(
            f"{self.idx_path}: corrupted index: byte offset of sequence {sequence}"
            f"{self._document_of(sequence)} is {offset}, expected {expected}: {what}")

    def verify(self) -> None:
        """Repeat the index checks of opening (kept for callers; they are all done on open).

        Raises:
            CorruptTokenFileError: with the first inconsistency found.
        """
        self._check_index(self.bin_path.stat().st_size)

    def __getstate__(self) -> dict:
        # Memory maps do not pickle; DataLoader workers reopen the files instead.
        return {"path_prefix": self.path_prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path_prefix"])

    def __repr__(self) -> str:
        return (f"IndexedDataset({self.path_prefix!r}, sequences={len(self)}, "
                f"documents={self.num_documents}, dtype={self.dtype.name})")


class IndexedDatasetWriter:
    """Streaming writer of a ``.bin``/``.idx`` pair; atomic on :meth:`finalize`.

    Tokens go straight to a temporary ``.bin``; lengths and document boundaries go to
    temporary raw files, so memory does not grow with the corpus. :meth:`finalize` writes the
    ``.idx`` and renames ``.bin`` then ``.idx`` into place: until the last rename no reader can
    see the output. Used as a context manager it finalizes on success and removes its
    temporary files on error.

    One writer per output: it holds the output's lock (``bloomline.common.output_lock``) from
    its exists-check to the last rename, so a second writer of the same prefix is refused at
    once instead of replacing the first's files when it finishes; and without ``overwrite``
    the renames never replace a file that appeared meanwhile (``publish_new``).

    Args:
        path_prefix: output ``corpus/NAME``.
        dtype: token dtype (see :func:`token_dtype_for_vocab`).
        overwrite: replace an existing pair instead of refusing.
        temporary_dir: where the temporary files go (default: the output's folder); must be
            on the output's filesystem (the outputs are renamed from there).
    """

    def __init__(self, path_prefix: str | os.PathLike, dtype: np.dtype | type,
                 overwrite: bool = False, temporary_dir: str | os.PathLike | None = None
                 ) -> None:
        self.idx_path, self.bin_path = _paths(path_prefix)
        self.dtype = np.dtype(dtype)
        if _CODE_OF_DTYPE.get(self.dtype) not in TOKEN_DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} is not an integer MMIDIDX token dtype")
        self._tmp: dict[str, Path] = {}
        self._files = {}
        self._done = False
        self._lock = OutputLock(str(self.bin_path)[: -len(".bin")])
        try:
            check_can_write([self.bin_path, self.idx_path], overwrite)
        except BaseException:
            self.abort()
            raise
        self.overwrite = overwrite
        self.idx_path.parent.mkdir(parents=True, exist_ok=True)
        for part in ("bin", "lengths", "docs", "idx"):
            fd, name = tempfile.mkstemp(prefix=f".{self.bin_path.stem}.{part}.",
                                        suffix=".partial",
                                        dir=temporary_dir or self.idx_path.parent)
            self._tmp[part] = Path(name)
            self._files[part] = os.fdopen(fd, "wb")
        self._files["idx"].close()
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0
        self._files["docs"].write(np.zeros(1, np.int64).tobytes())

    def _check_tokens(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.dtype != self.dtype:
            if tokens.size and np.issubdtype(self.dtype, np.integer):
                info = np.iinfo(self.dtype)
                if tokens.min() < info.min or tokens.max() > info.max:
                    raise ValueError(f"token ids outside the range of {self.dtype.name}")
            tokens = tokens.astype(self.dtype)
        return tokens

    def add_document(self, tokens: np.ndarray, sequence_lengths: list[int] | None = None
                     ) -> None:
        """Append one document: its tokens, split into sequences by ``sequence_lengths``.

        Without ``sequence_lengths`` the document is one sequence, or none when it is empty
        (Megatron's convention: an empty document repeats its boundary).
        """
        tokens = self._check_tokens(tokens)
        if sequence_lengths is None:
            sequence_lengths = [len(tokens)] if len(tokens) else []
        lengths = np.asarray(sequence_lengths, dtype=np.int64)
        if lengths.sum() != len(tokens) or (lengths.size and lengths.min() < 1):
            raise ValueError("sequence_lengths must be positive and sum to len(tokens)")
        self._append(tokens, lengths, np.array([len(lengths)], dtype=np.int64))

    def add_documents(self, tokens: np.ndarray, document_lengths: np.ndarray) -> None:
        """Append many one-sequence documents at once (the fast path of the tokenizer).

        ``tokens`` is their concatenation; a zero in ``document_lengths`` is an empty document.
        """
        tokens = self._check_tokens(tokens)
        document_lengths = np.asarray(document_lengths, dtype=np.int64)
        if document_lengths.sum() != len(tokens):
            raise ValueError("document_lengths must sum to len(tokens)")
        nonempty = document_lengths > 0
        self._append(tokens, document_lengths[nonempty], nonempty.astype(np.int64))

    def _append(self, tokens: np.ndarray, lengths: np.ndarray, seqs_per_doc: np.ndarray
                ) -> None:
        self._files["bin"].write(tokens.tobytes())
        self._files["lengths"].write(lengths.astype(np.int32).tobytes())
        bounds = self.num_sequences + np.cumsum(seqs_per_doc)
        self._files["docs"].write(bounds.astype(np.int64).tobytes())
        self.num_sequences += len(lengths)
        self.num_documents += len(seqs_per_doc)
        self.num_tokens += len(tokens)

    def add_index(self, path_prefix: str | os.PathLike) -> None:
        """Append every document of an existing pair (``dataprep merge``), copying in-kernel."""
        other = IndexedDataset(path_prefix)
        if other.dtype != self.dtype:
            raise UserError(f"{other.idx_path}: tokens are {other.dtype.name}, but the output "
                            f"is {self.dtype.name}; merge only files of one tokenizer")
        bin_out = self._files["bin"]
        bin_out.flush()
        with open(other.bin_path, "rb") as src:
            _copy_file(src, bin_out, other.bin_path.stat().st_size)
        self._files["lengths"].write(other.sequence_lengths.tobytes())
        bounds = other.document_indices[1:] + self.num_sequences
        for start in range(0, len(bounds), _BLOCK):
            self._files["docs"].write(bounds[start : start + _BLOCK].tobytes())
        self.num_sequences += len(other)
        self.num_documents += other.num_documents
        self.num_tokens += other.num_tokens

    def finalize(self) -> None:
        """Write the ``.idx`` and move both files into place (``.idx`` last)."""
        for part in ("bin", "lengths", "docs"):
            self._files[part].close()
        try:
            lengths = _map_raw(self._tmp["lengths"], np.int32)
            docs = _map_raw(self._tmp["docs"], np.int64)
            write_index(self._tmp["idx"], self.dtype, lengths, docs)
            del lengths, docs
            if self.overwrite:
                publish(self._tmp["bin"], self.bin_path)
                publish(self._tmp["idx"], self.idx_path)
            else:  # the pair, or neither: never over a file written since the check
                publish_new(self._tmp["bin"], self.bin_path)
                try:
                    publish_new(self._tmp["idx"], self.idx_path)
                except BaseException:
                    self.bin_path.unlink(missing_ok=True)
                    raise
        finally:
            self._done = True
            self._remove_temporaries()

    def abort(self) -> None:
        """Drop everything written so far."""
        for fh in self._files.values():
            with contextlib.suppress(OSError):  # flushing onto a full disk: closed anyway
                fh.close()
        self._done = True
        self._remove_temporaries()

    def _remove_temporaries(self) -> None:
        for path in self._tmp.values():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if getattr(self, "_lock", None) is not None:
            self._lock.release()

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._done:
            return
        if exc_type is None:
            self.finalize()
        else:
            self.abort()

    def __del__(self) -> None:
        # A writer dropped without finalize (an exception in the caller) leaves no litter.
        if not getattr(self, "_done", True):
            self.abort()


def _map_raw(path: Path, dtype: type) -> np.ndarray:
    size = path.stat().st_size
    return np.memmap(path, dtype, "r") if size else np.zeros(0, dtype)


def _copy_file(src, dst, count: int) -> None:
    """Append ``count`` bytes of ``src`` to ``dst``: in the kernel where the OS allows it."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        remaining = count
        try:
            while remaining:
                copied = copy_range(src.fileno(), dst.fileno(), min(remaining, 1 << 30))
                if copied == 0:
                    break
                remaining -= copied
            if remaining == 0:
                # copy_file_range moved the fd's position; keep Python's buffered view in sync
                dst.seek(0, os.SEEK_END)
                return
        except OSError:
            pass  # e.g. across filesystems on old kernels: fall back from where we are
        src.seek(count - remaining)
        dst.seek(0, os.SEEK_END)
        count = remaining
    while count:
        block = src.read(min(count, 1 << 24))
        if not block:
            raise OSError(f"{src.name}: shorter than expected")
        dst.write(block)
        count -= len(block)


def merge_indexed_datasets(path_prefixes: list[str | os.PathLike],
                           output_prefix: str | os.PathLike, overwrite: bool = False
                           ) -> IndexedDataset:
    """Concatenate token files in the given order into ``output_prefix`` (atomically)."""
    if not path_prefixes:
        raise UserError("merge: give at least one input prefix")
    first = IndexedDataset(path_prefixes[0])
    # refuse inputs of different tokenizers before writing anything; the output records theirs
    record = check_same_tokenizer({str(p): p for p in path_prefixes})
    with IndexedDatasetWriter(output_prefix, first.dtype, overwrite=overwrite) as writer:
        for prefix in path_prefixes:
            writer.add_index(prefix)
        # an overwritten output's records go: its shard record would claim it is a part
        Path(f"{output_prefix}.shard.json").unlink(missing_ok=True)
        fingerprint_path(output_prefix).unlink(missing_ok=True)  # an overwritten output's
    if record is not None:
        write_fingerprint_record(output_prefix, record)
    return IndexedDataset(output_prefix)
