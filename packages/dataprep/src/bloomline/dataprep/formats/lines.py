"""Line files (JSON lines, text), plain or compressed: what their formats share.

An uncompressed file is cut into byte ranges and never read by the process that hands out
work: its worker reads the whole lines that *start* in its range (:func:`read_line_range`), so
with Ray the driver sends each task a few numbers. A compressed stream cannot be entered in
the middle, so its lines are cut here, in one sequential pass, and carried as raw bytes: one
big compressed file still feeds every worker. Line numbers for messages: known for compressed
chunks; for byte ranges, counted from the file's start only when a message needs one.

A new compression is one entry of :data:`COMPRESSIONS` and its suffixes in the formats.
"""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

import zstandard

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular
from bloomline.dataprep.formats.base import Chunk, ChunkSizer, DocumentCollector, Format, Source

__all__ = [
    "COMPRESSIONS",
    "LineFormat",
    "count_lines_before",
    "read_line_range",
    "where",
]


def _zstd_reader(raw: BinaryIO) -> BinaryIO:
    # read_across_frames: files made by concatenating .zst files (as `cat` and many corpus
    # tools do) hold several frames; all of them are the file's content.
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


def _gzip_reader(raw: BinaryIO) -> BinaryIO:
    return gzip.GzipFile(fileobj=raw, mode="rb")


# compression name (Source.compression) -> decompressing reader over the raw file
COMPRESSIONS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    "zst": _zstd_reader,
    "gz": _gzip_reader,
}
_DECOMPRESS_ERRORS = (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError)


def _open_binary(source: Source):
    """(decompressed stream, raw file): the raw file's position tracks on-disk progress."""
    raw = open_regular(source.path, "input")  # closed by the caller through the pair
    if source.compression is not None:
        return COMPRESSIONS[source.compression](raw), raw
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
    with open_regular(path, "input") as fh:
        if start > 0:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                _skip_rest_of_line(fh)  # of a line that started before ``start``
        first = fh.tell()
        if first >= stop:
            return b"", first
        data = fh.read(stop - first)
        if data and not data.endswith(b"\n"):
            data += fh.readline()  # the last line started inside the range: all of it
        return data, first


def _skip_rest_of_line(fh) -> None:
    """Move past the next newline in pieces: a line of gigabytes is never held whole here."""
    while True:
        piece = fh.readline(1 << 20)
        if not piece or piece.endswith(b"\n"):
            return


def count_lines_before(path: str, offset: int) -> int:
    """Newlines in the first ``offset`` bytes of ``path`` (for a line number in a message)."""
    count = 0
    with open_regular(path, "input") as fh:
        while offset > 0:
            block = fh.read(min(offset, 1 << 24))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def where(chunk: Chunk, offset: int) -> str:
    """``FILE:LINE`` of line ``offset`` of the chunk (counted from the file's start the first
    time a byte-range chunk needs it: only messages pay for it)."""
    if chunk.first_line == 0:
        chunk.first_line = count_lines_before(chunk.source.path, chunk.start) + 1
    return f"{chunk.source.path}:{chunk.first_line + offset}"


class LineFormat(Format):
    """A format of line files: byte ranges when uncompressed, carried lines when compressed."""

    def cut_by_bytes(self, source: Source, txt_per_line: bool) -> bool:
        """Whether ``source`` is cut at line starts (any byte can be reached by a seek)."""
        return source.compression is None

    def chunks(self, source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
        make = _range_chunks if source.compression is None else _line_chunks
        return make(source, sizer, next_index)

    def read_range(self, chunk: Chunk) -> Chunk:
        """A "range" chunk read here, in the worker (the lines starting in the range), as a
        "lines" chunk; other chunks as they are."""
        if chunk.kind != "range":
            return chunk
        payload, first = read_line_range(chunk.source.path, chunk.start, chunk.stop)
        return dataclasses.replace(chunk, kind="lines", payload=payload, start=first)

    def shard_part(self, source: Source, begin: int, end: int | float,
                   txt_per_line: bool) -> Source | None:
        if not self.cut_by_bytes(source, txt_per_line):
            return super().shard_part(source, begin, end, txt_per_line)
        start, stop = max(begin, 0), min(end, source.size)
        if start < stop:
            return dataclasses.replace(source, start=start, stop=stop, part_bytes=stop - start)
        return None

    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        raise NotImplementedError(self.name)
