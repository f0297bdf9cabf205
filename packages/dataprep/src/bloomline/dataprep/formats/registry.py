"""The input formats ``dataprep tokenize`` and ``train-tokenizer`` read: one line each.

A new format is a module with a :class:`~.base.Format` (its suffixes, chunks, documents and
``--shard`` parts) and a line here. File names are matched against the formats' suffixes in
this order.
"""

from __future__ import annotations

from pathlib import Path

from bloomline.dataprep.formats.base import Format
from bloomline.dataprep.formats.hf_dataset import HF_DATASET
from bloomline.dataprep.formats.jsonl import JSONL
from bloomline.dataprep.formats.parquet import PARQUET
from bloomline.dataprep.formats.text import TEXT

__all__ = ["FORMATS", "SUPPORTED_SUFFIXES", "folder_format", "format_of_file"]

FORMATS: dict[str, Format] = {fmt.name: fmt for fmt in (JSONL, PARQUET, TEXT, HF_DATASET)}

SUPPORTED_SUFFIXES = tuple(suffix for fmt in FORMATS.values() for suffix in fmt.suffixes)


def format_of_file(path: str) -> tuple[Format, str | None] | None:
    """(format, compression) of a file by its name, or None when no format claims it."""
    name = path.lower()
    for fmt in FORMATS.values():
        for suffix, compression in fmt.suffixes.items():
            if name.endswith(suffix):
                return fmt, compression
    return None


def folder_format(path: Path) -> Format | None:
    """The format of a folder that is itself one source (a dataset folder), or None."""
    for fmt in FORMATS.values():
        if fmt.is_folder_of(path):
            return fmt
    return None
