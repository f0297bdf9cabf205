"""Parquet files: the document of each row under each ``--json-key`` column.

Chunks are runs of row groups (sized by their uncompressed bytes); a ``--shard`` owns the
row groups whose place in the file's share of the job's bytes (by compressed size) it holds.
Only metadata is read to plan either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from bloomline.common.errors import UserError
from bloomline.dataprep.formats.arrow_rows import arrow_rows, require_columns
from bloomline.dataprep.formats.base import (
    Chunk,
    ChunkSizer,
    DocumentCollector,
    Format,
    Source,
    units_in_range,
)

__all__ = ["PARQUET"]


def _metadata(source: Source):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(source.path).metadata
    except Exception as err:  # pyarrow raises several types for a bad file
        raise UserError(f"{source.path}: not a readable Parquet file ({err})") from None


def _positions(source: Source) -> list[int]:
    """The offset of each row group inside the file's share of the line of bytes."""
    meta = _metadata(source)
    sizes = [sum(meta.row_group(g).column(c).total_compressed_size
                 for c in range(meta.row_group(g).num_columns))
             for g in range(meta.num_row_groups)]
    total = max(sum(sizes), 1)
    positions, before = [], 0
    for size in sizes:
        positions.append(source.size * before // total)
        before += size
    return positions


class ParquetFormat(Format):
    """Parquet files (see the module docstring)."""

    name = "parquet"
    suffixes = {".parquet": None}

    def chunks(self, source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
        meta = _metadata(source)
        groups: list[int] = []
        text_bytes = disk_bytes = accounted = 0
        last = meta.num_row_groups if source.stop is None else source.stop
        for g in range(source.start, last):
            rg = meta.row_group(g)
            groups.append(g)
            text_bytes += rg.total_byte_size
            disk_bytes += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            if text_bytes >= sizer.next_size() or g == last - 1:
                if g == last - 1:  # the footer and page headers too: progress ends at the total
                    disk_bytes = max(disk_bytes, source.work_bytes - accounted)
                yield Chunk(next_index, source, "parquet", groups=tuple(groups),
                            source_bytes=disk_bytes)
                next_index += 1
                accounted += disk_bytes
                groups, text_bytes, disk_bytes = [], 0, 0

    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        import pyarrow.parquet as pq

        path = chunk.source.path
        pf = pq.ParquetFile(path)
        require_columns(path, keys, pf.schema_arrow.names)
        first_row = sum(pf.metadata.row_group(g).num_rows for g in range(chunk.groups[0]))
        arrow_rows(path, pf.read_row_groups(list(chunk.groups), columns=keys), first_row,
                   keys, out)

    def shard_part(self, source: Source, begin: int, end: int | float,
                   txt_per_line: bool) -> Source | None:
        positions = _positions(source)
        first, stop = units_in_range(positions, begin, end)
        if first >= stop:
            return None
        tail = positions[stop] if stop < len(positions) else source.size
        return dataclasses.replace(source, start=first, stop=stop,
                                   part_bytes=tail - positions[first])


PARQUET = ParquetFormat()
