"""Plain text: ``.txt`` files, each one document, or (``--txt-per-line``) each line one.

Files of one document each are grouped with their neighbours into "files" chunks by
``iter_chunks`` and go whole to one ``--shard``; line-per-document files are cut like any
line file. Text has no keys: its one text goes under the single ``--json-key``.
"""

from __future__ import annotations

import os

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular
from bloomline.dataprep.formats.base import Chunk, DocumentCollector, Source
from bloomline.dataprep.formats.lines import LineFormat, where

__all__ = ["TEXT"]


def _text_lines(chunk: Chunk, out: DocumentCollector) -> None:
    (texts,) = out.docs.texts.values()
    for offset, raw in enumerate(chunk.payload.split(b"\n")):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        if out.too_big(len(raw)):
            out.oversized(where(chunk, offset), len(raw))
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            out.bad(f"{where(chunk, offset)}: not valid UTF-8 (byte {err.start} of the line)")
    out.docs.text_bytes += len(chunk.payload)


def _text_files(chunk: Chunk, out: DocumentCollector) -> None:
    (texts,) = out.docs.texts.values()
    for path in chunk.files:
        with open_regular(path, "input") as fh:
            size = os.fstat(fh.fileno()).st_size
            if out.too_big(size):
                out.oversized(path, size, "file")
                continue
            raw = fh.read()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            line = raw.count(b"\n", 0, err.start) + 1
            out.bad(f"{path}:{line}: not valid UTF-8 (byte {err.start} of the file)")
            continue
        out.docs.text_bytes += len(raw)


class TextFormat(LineFormat):
    """``.txt`` files (see the module docstring)."""

    name = "txt"
    suffixes = {".txt": None}

    def groups_whole_files(self, txt_per_line: bool) -> bool:
        return not txt_per_line

    def cut_by_bytes(self, source: Source, txt_per_line: bool) -> bool:
        return txt_per_line and source.compression is None

    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        chunk = self.read_range(chunk)
        if len(keys) > 1:
            raise UserError(f"{chunk.source.path}: text files have no keys; "
                            "give a single --json-key with .txt inputs")
        if chunk.kind == "files":
            _text_files(chunk, out)
        else:
            _text_lines(chunk, out)


TEXT = TextFormat()
