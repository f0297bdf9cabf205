"""Input discovery and chunking: turn INPUT arguments into an ordered stream of work chunks.

A *source* is one input file or Hugging Face dataset folder, with its format (or the part of
one that a ``--shard`` owns, see :mod:`bloomline.dataprep.sharding`). A *chunk* is a slice of a
source small enough to tokenize in seconds: a byte range of an uncompressed JSON-lines or text
file (its worker reads the whole lines that *start* in the range), whole lines of a compressed
one (carried as raw bytes, decompressed here), row groups of a Parquet file, a row range of a
``save_to_disk`` folder, or a group of one-document text files. Chunks are numbered in input
order; the tokenized output is the concatenation of chunks in that order, so it does not
depend on how many workers (or machines) tokenized them.

Uncompressed files are never read here: a byte range is all a worker needs, so the process
that hands out work moves no text (with Ray, the driver sends each task a few numbers, and
the task reads its lines from the shared filesystem). A compressed stream cannot be entered
in the middle, so its lines are cut here, in one sequential pass, so that one big compressed
file still feeds every worker. Line numbers for error messages: known for compressed chunks;
for byte ranges, counted from the file's start only when a message needs one.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from bloomline.common.errors import UserError

__all__ = [
    "Chunk",
    "ChunkSizer",
    "SUPPORTED_SUFFIXES",
    "Source",
    "count_lines_before",
    "expand_inputs",
    "iter_chunks",
    "read_line_range",
]

# Longest suffix first so that ".jsonl.zst" is not read as ".zst".
_FORMATS = {
    ".jsonl.zst": ("jsonl", "zst"),
    ".json.zst": ("jsonl", "zst"),
    ".jsonl.gz": ("jsonl", "gz"),
    ".json.gz": ("jsonl", "gz"),
    ".jsonl": ("jsonl", None),
    ".json": ("jsonl", None),  # as in Megatron's preprocess_data.py: one object per line
    ".parquet": ("parquet", None),
    ".txt": ("txt", None),
}
SUPPORTED_SUFFIXES = tuple(_FORMATS)
DEFAULT_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 256 << 10
_DECOMPRESS_ERRORS = (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError)


@dataclass(frozen=True)
class Source:
    """One input: a file with a known format, or a ``save_to_disk`` dataset folder."""

    path: str
    format: str  # "jsonl" | "txt" | "parquet" | "hf"
    compression: str | None = None
    size: int = 0  # bytes on disk, for progress and ETA
    # The part of the source to read (a --shard's part): bytes of an uncompressed line file,
    # row groups of a Parquet file, rows of a dataset folder; stop None = to the end.
    start: int = 0
    stop: int | None = None
    part_bytes: int | None = None  # the part's share of ``size`` (None: the whole source)

    @property
    def work_bytes(self) -> int:
        """On-disk bytes this source stands for in this job (its part's, when a part)."""
        return self.size if self.part_bytes is None else self.part_bytes


@dataclass
class Chunk:
    """A unit of tokenizing work; ``index`` is its place in the output.

    Attributes:
        kind: "lines" (``payload`` holds whole JSON or text lines), "range" (the lines of
            ``source.path`` that start at a byte in ``start:stop``), "parquet" (row groups
            ``groups`` of ``source.path``), "hf" (rows ``start:stop`` of a dataset folder) or
            "files" (``files``, one document each).
        first_line: 1-based line number of the first line of ``payload``; 0 while unknown
            (a "range" chunk; see :func:`count_lines_before`).
        source_bytes: this chunk's share of the on-disk input, for progress and ETA.
    """

    index: int
    source: Source
    kind: str
    payload: bytes = b""
    first_line: int = 1
    groups: tuple[int, ...] = ()
    start: int = 0
    stop: int = 0
    files: tuple[str, ...] = field(default_factory=tuple)
    source_bytes: int = 0


class ChunkSizer:
    """How many input bytes the next chunk should take.

    ``max_bytes`` while plenty of work remains; then a quarter of each worker's share of what
    is left, so chunks taper off towards the end and all workers finish within a small chunk
    of each other instead of one worker tokenizing a last 8 MiB chunk alone. Small inputs get
    small chunks from the start, so every worker has work. Sizes change how work is shared,
    never the output.
    """

    def __init__(self, total_bytes: int, max_bytes: int = DEFAULT_CHUNK_BYTES,
                 workers: int = 1) -> None:
        self.remaining = total_bytes
        self.max_bytes = max_bytes
        self.min_bytes = min(MIN_CHUNK_BYTES, max_bytes)
        self.workers = workers

    def next_size(self) -> int:
        """Bytes for the next chunk."""
        share = self.remaining // (4 * self.workers)
        return int(min(self.max_bytes, max(self.min_bytes, share)))

    def consumed(self, num_bytes: int) -> None:
        """Account for a chunk handed out (its on-disk bytes)."""
        self.remaining -= num_bytes


def _format_of(path: str) -> tuple[str, str | None] | None:
    name = path.lower()
    for suffix, fmt in _FORMATS.items():
        if name.endswith(suffix):
            return fmt
    return None


def _is_hf_dataset_dir(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def _source_for_dir(path: Path) -> list[Source]:
    if _is_hf_dataset_dir(path):
        size = sum(p.stat().st_size for p in path.glob("*.arrow"))
        return [Source(str(path), "hf", size=size)]
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if _is_hf_dataset_dir(p))
        raise UserError(f"{path}: a Hugging Face DatasetDict; pass one split folder instead, "
                        f"e.g. {path / splits[0]}" if splits else f"{path}: empty DatasetDict")
    found: list[Source] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        root_path = Path(root)
        if root_path != path and _is_hf_dataset_dir(root_path):
            dirs[:] = []
            found.extend(_source_for_dir(root_path))
            continue
        for name in sorted(files):
            if name.startswith("."):
                continue
            fmt = _format_of(name)
            if fmt is not None:
                full = root_path / name
                found.append(Source(str(full), fmt[0], fmt[1], full.stat().st_size))
    if not found:
        raise UserError(f"{path}: directory holds no supported input "
                        f"({', '.join(SUPPORTED_SUFFIXES)} or a save_to_disk dataset)")
    return found


def _source_for_path(path: str) -> list[Source]:
    p = Path(path)
    if p.is_dir():
        return _source_for_dir(p)
    fmt = _format_of(path)
    if fmt is None:
        raise UserError(f"{path}: unsupported input type; expected one of "
                        f"{', '.join(SUPPORTED_SUFFIXES)}, a directory or a save_to_disk folder")
    if not os.access(path, os.R_OK):
        raise UserError(f"{path}: not readable")
    return [Source(path, fmt[0], fmt[1], p.stat().st_size)]


def expand_inputs(inputs: list[str]) -> list[Source]:
    """Resolve files, globs and directories, in argument order (globs and folders sorted).

    Raises:
        UserError: for a path that does not exist, a glob or folder that matches nothing, or
            an unsupported file type.
    """
    if not inputs:
        raise UserError("no INPUT given")
    sources: list[Source] = []
    for arg in inputs:
        if glob.has_magic(arg):
            matches = sorted(glob.glob(arg, recursive=True))
            if not matches:
                raise UserError(f"{arg}: glob matches no file")
            for match in matches:
                sources.extend(_source_for_path(match))
        elif os.path.exists(arg):
            sources.extend(_source_for_path(arg))
        else:
            raise UserError(f"{arg}: no such file or directory")
    return sources


def _open_binary(source: Source):
    """(decompressed stream, raw file): the raw file's position tracks on-disk progress."""
    raw = open(source.path, "rb")  # noqa: SIM115 - closed by the caller through the pair
    if source.compression == "zst":
        # read_across_frames: files made by concatenating .zst files (as `cat` and many
        # corpus tools do) hold several frames; all of them are the file's content.
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True), raw
    if source.compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def _line_chunks(source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
    stream, raw = _open_binary(source)
    try:
        carry = b""
        line_no = 1
        consumed = 0
        while True:
            try:
                block = stream.read(sizer.next_size())
            except _DECOMPRESS_ERRORS as err:  # corrupt .gz/.zst
                raise UserError(f"{source.path}: cannot decompress ({err})") from None
            if block:
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # one line longer than a chunk: keep reading
                    carry = data
                    continue
                payload, carry = data[:cut], data[cut:]
            else:
                payload, carry = carry, b""
            if not payload:
                return
            position = raw.tell()
            yield Chunk(next_index, source, "lines", payload=payload, first_line=line_no,
                        source_bytes=position - consumed)
            consumed = position
            next_index += 1
            line_no += payload.count(b"\n")
    finally:
        stream.close()
        raw.close()


def _range_chunks(source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
    position = source.start
    end = source.size if source.stop is None else source.stop
    while position < end:
        stop = min(end, position + sizer.next_size())
        yield Chunk(next_index, source, "range", start=position, stop=stop, first_line=0,
                    source_bytes=stop - position)
        next_index += 1
        position = stop


def read_line_range(path: str, start: int, stop: int) -> tuple[bytes, int]:
    """(the whole lines of ``path`` that start at a byte in [start, stop), where the first
    of them starts).

    The rule "a line belongs to the range holding its first byte" puts every line in exactly
    one of any ranges that tile the file, whoever reads them: chunk ranges and ``--shard``
    parts need no agreement beyond their byte offsets.
    """
    with open(path, "rb") as fh:
        if start > 0:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # the rest of a line that started before ``start``
        first = fh.tell()
        if first >= stop:
            return b"", first
        data = fh.read(stop - first)
        if data and not data.endswith(b"\n"):
            data += fh.readline()  # the last line started inside the range: all of it
        return data, first


def count_lines_before(path: str, offset: int) -> int:
    """Newlines in the first ``offset`` bytes of ``path`` (for a line number in a message)."""
    count = 0
    with open(path, "rb") as fh:
        while offset > 0:
            block = fh.read(min(offset, 1 << 24))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def _parquet_chunks(source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(source.path).metadata
    except Exception as err:  # pyarrow raises several types for a bad file
        raise UserError(f"{source.path}: not a readable Parquet file ({err})") from None
    groups: list[int] = []
    text_bytes = disk_bytes = 0
    last = meta.num_row_groups if source.stop is None else source.stop
    for g in range(source.start, last):
        rg = meta.row_group(g)
        groups.append(g)
        text_bytes += rg.total_byte_size
        disk_bytes += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if text_bytes >= sizer.next_size() or g == last - 1:
            yield Chunk(next_index, source, "parquet", groups=tuple(groups),
                        source_bytes=disk_bytes)
            next_index += 1
            groups, text_bytes, disk_bytes = [], 0, 0


def _hf_chunks(source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
    from bloomline.dataprep.documents import load_hf_dataset

    dataset = load_hf_dataset(source.path)
    num_rows = len(dataset) if source.stop is None else source.stop
    if num_rows == 0:
        return
    bytes_per_row = max(1, source.size // len(dataset))
    start = source.start
    while start < num_rows:
        stop = min(num_rows, start + max(1, sizer.next_size() // bytes_per_row))
        yield Chunk(next_index, source, "hf", start=start, stop=stop,
                    source_bytes=(stop - start) * bytes_per_row)
        next_index += 1
        start = stop


def iter_chunks(sources: list[Source], max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                txt_per_line: bool = False, workers: int = 1) -> Iterator[Chunk]:
    """Chunks of all sources, numbered 0, 1, ... in input order, sized by :class:`ChunkSizer`.

    ``.txt`` files are one document each, grouped into chunks; with ``txt_per_line`` every
    line of a ``.txt`` file is a document instead.
    """
    sizer = ChunkSizer(sum(s.work_bytes for s in sources), max_chunk_bytes, workers)
    index = 0
    pending_files: list[Source] = []

    def flush_files() -> Iterator[Chunk]:
        nonlocal index, pending_files
        if pending_files:
            chunk = Chunk(index, pending_files[0], "files",
                          files=tuple(s.path for s in pending_files),
                          source_bytes=sum(s.size for s in pending_files))
            sizer.consumed(chunk.source_bytes)
            index += 1
            pending_files = []
            yield chunk

    for source in sources:
        if source.format == "txt" and not txt_per_line:
            pending_files.append(source)
            if sum(s.size for s in pending_files) >= sizer.next_size():
                yield from flush_files()
            continue
        yield from flush_files()
        if source.format in ("jsonl", "txt") and source.compression is None:
            make = _range_chunks
        elif source.format in ("jsonl", "txt"):
            make = _line_chunks
        elif source.format == "parquet":
            make = _parquet_chunks
        else:
            make = _hf_chunks
        for chunk in make(source, sizer, index):
            # account before the generator resumes: it sizes its next chunk from what is left
            sizer.consumed(chunk.source_bytes)
            index = chunk.index + 1
            yield chunk
    yield from flush_files()
