"""Input discovery and chunking: turn INPUT arguments into an ordered stream of work chunks.

A *source* is one input file or Hugging Face dataset folder, with its format (or the part of
one that a ``--shard`` owns, see :mod:`bloomline.dataprep.sharding`). A *chunk* is a slice of a
source small enough to tokenize in seconds. Chunks are numbered in input order; the tokenized
output is the concatenation of chunks in that order, so it does not depend on how many
workers (or machines) tokenized them. How each format is recognised and cut is its own
module's business (:mod:`bloomline.dataprep.formats`); this module resolves the arguments and
numbers the chunks.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import require_regular_file
from bloomline.dataprep.formats import (
    FORMATS,
    SUPPORTED_SUFFIXES,
    folder_format,
    format_of_file,
)
from bloomline.dataprep.formats.base import (
    DEFAULT_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    Chunk,
    ChunkSizer,
    Source,
)
from bloomline.dataprep.formats.lines import count_lines_before, read_line_range
from bloomline.dataprep.input_overlap import drop_repeated_sources

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MIN_CHUNK_BYTES",
    "Chunk",
    "ChunkSizer",
    "SUPPORTED_SUFFIXES",
    "Source",
    "count_lines_before",
    "expand_inputs",
    "iter_chunks",
    "read_line_range",
]


def _source_for_dir(path: Path) -> list[Source]:
    fmt = folder_format(path)
    if fmt is not None:
        return [fmt.folder_source(path)]
    for fmt in FORMATS.values():
        fmt.check_folder(path)
    found: list[Source] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        root_path = Path(root)
        if root_path != path and folder_format(root_path) is not None:
            dirs[:] = []
            found.extend(_source_for_dir(root_path))
            continue
        for name in sorted(files):
            if name.startswith("."):
                continue
            claimed = format_of_file(name)
            if claimed is not None:
                # a FIFO or device named like an input would read as empty, or block forever
                full = require_regular_file(root_path / name, "input")
                found.append(Source(str(full), claimed[0].name, claimed[1],
                                    full.stat().st_size))
    if not found:
        raise UserError(f"{path}: directory holds no supported input "
                        f"({', '.join(SUPPORTED_SUFFIXES)} or a save_to_disk dataset)")
    return found


def _source_for_path(path: str) -> list[Source]:
    p = Path(path)
    if p.is_dir():
        return _source_for_dir(p)
    claimed = format_of_file(path)
    if claimed is None:
        raise UserError(f"{path}: unsupported input type; expected one of "
                        f"{', '.join(SUPPORTED_SUFFIXES)}, a directory or a save_to_disk folder")
    # a FIFO reads as an empty file (its size is 0) or blocks forever, a device never ends
    require_regular_file(p, "input")
    if not os.access(path, os.R_OK):
        raise UserError(f"{path}: not readable")
    return [Source(path, claimed[0].name, claimed[1], p.stat().st_size)]


def expand_inputs(inputs: list[str]) -> list[Source]:
    """Resolve files, globs and directories, in argument order (globs and folders sorted).

    A file named twice (a folder and a file in it, ``./x`` and ``x``, a link and its target)
    is read once, at its first place, with a ``warning:`` line on stderr
    (:mod:`~bloomline.dataprep.input_overlap`).

    Raises:
        UserError: for a path that does not exist, a glob or folder that matches nothing, or
            an unsupported file type.
    """
    if not inputs:
        raise UserError("no INPUT given")
    groups: list[tuple[str, bool, list[Source]]] = []
    for arg in inputs:
        if glob.has_magic(arg):
            matches = sorted(glob.glob(arg, recursive=True))
            if not matches:
                raise UserError(f"{arg}: glob matches no file")
            groups.append((arg, True, [s for match in matches for s in _source_for_path(match)]))
        elif os.path.exists(arg):
            groups.append((arg, os.path.isdir(arg), _source_for_path(arg)))
        else:
            raise UserError(f"{arg}: no such file or directory")
    sources, notes = drop_repeated_sources(groups)
    for note in notes:
        print(note, file=sys.stderr)
    return sources


def iter_chunks(sources: list[Source], max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                txt_per_line: bool = False, workers: int = 1) -> Iterator[Chunk]:
    """Chunks of all sources, numbered 0, 1, ... in input order, sized by :class:`ChunkSizer`.

    ``.txt`` files are one document each, grouped into chunks; with ``txt_per_line`` every
    line of a ``.txt`` file is a document instead. Every other source is cut by its format.
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
        fmt = FORMATS[source.format]
        if fmt.groups_whole_files(txt_per_line):
            pending_files.append(source)
            if sum(s.size for s in pending_files) >= sizer.next_size():
                yield from flush_files()
            continue
        yield from flush_files()
        for chunk in fmt.chunks(source, sizer, index):
            # account before the generator resumes: it sizes its next chunk from what is left
            sizer.consumed(chunk.source_bytes)
            index = chunk.index + 1
            yield chunk
    yield from flush_files()
