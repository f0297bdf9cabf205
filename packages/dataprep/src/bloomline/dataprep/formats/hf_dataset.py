"""Hugging Face ``save_to_disk`` dataset folders: the document of each row under each
``--json-key`` column, read memory-mapped through ``datasets`` (imported on first use).

A folder is one when it holds ``state.json`` and ``dataset_info.json``; a ``DatasetDict``
folder is refused with the split folders to pass instead. Chunks and ``--shard`` parts are
row ranges; a row's place in the job's bytes is its share of the folder's ``.arrow`` bytes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path

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

__all__ = ["HF_DATASET", "load_hf_dataset"]


@functools.lru_cache(maxsize=8)
def load_hf_dataset(path: str):
    """A ``save_to_disk`` folder as a memory-mapped ``datasets.Dataset`` (cached per process)."""
    import datasets

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as err:  # datasets raises many types for a bad folder
        raise UserError(f"{path}: not a readable save_to_disk dataset ({err})") from None
    if not isinstance(dataset, datasets.Dataset):
        raise UserError(f"{path}: a DatasetDict; pass one split folder instead")
    return dataset


def _is_dataset_dir(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


class _RowPositions:
    """Row ``r`` of a dataset folder of ``size`` bytes and ``rows`` rows sits at
    ``size * r // rows``: a sorted sequence for bisect without a list of every row."""

    def __init__(self, size: int, rows: int) -> None:
        self.size, self.rows = size, rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, row: int) -> int:
        return self.size * row // self.rows


class HuggingFaceDatasetFormat(Format):
    """``save_to_disk`` folders (see the module docstring)."""

    name = "hf"

    def is_folder_of(self, path: Path) -> bool:
        return _is_dataset_dir(path)

    def folder_source(self, path: Path) -> Source:
        size = sum(p.stat().st_size for p in path.glob("*.arrow"))
        return Source(str(path), self.name, size=size)

    def check_folder(self, path: Path) -> None:
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if _is_dataset_dir(p))
            raise UserError(f"{path}: a Hugging Face DatasetDict; pass one split folder "
                            f"instead, e.g. {path / splits[0]}" if splits
                            else f"{path}: empty DatasetDict")

    def chunks(self, source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
        dataset = load_hf_dataset(source.path)
        num_rows = len(dataset) if source.stop is None else source.stop
        if num_rows == 0:
            return
        bytes_per_row = max(1, source.size // len(dataset))
        start, accounted = source.start, 0
        while start < num_rows:
            stop = min(num_rows, start + max(1, sizer.next_size() // bytes_per_row))
            share = (stop - start) * bytes_per_row
            if stop == num_rows:  # with what bytes_per_row's rounding left: progress ends at 100%
                share = max(share, source.work_bytes - accounted)
            yield Chunk(next_index, source, "hf", start=start, stop=stop, source_bytes=share)
            next_index += 1
            accounted += share
            start = stop

    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        path = chunk.source.path
        dataset = load_hf_dataset(path)
        require_columns(path, keys, dataset.column_names)
        table = dataset.with_format("arrow")[chunk.start : chunk.stop].select(keys)
        arrow_rows(path, table, chunk.start, keys, out)

    def shard_part(self, source: Source, begin: int, end: int | float,
                   txt_per_line: bool) -> Source | None:
        rows = _RowPositions(source.size, len(load_hf_dataset(source.path)))
        first, stop = units_in_range(rows, begin, end)
        if first >= stop:
            return None
        tail = rows[stop] if stop < rows.rows else source.size
        return dataclasses.replace(source, start=first, stop=stop,
                                   part_bytes=tail - rows[first])


HF_DATASET = HuggingFaceDatasetFormat()
