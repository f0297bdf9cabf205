"""Documents out of a chunk: the texts of each key, checked, with bad lines named or skipped.

Every problem with the input is reported as ``FILE:LINE: what`` (``FILE: row N: what`` for
Parquet and dataset folders). With ``skip_bad_lines`` a bad line is counted and skipped for
all keys at once, so the outputs of several ``--json-key``\\ s stay aligned document by document.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field

from bloomline.common.errors import UserError
from bloomline.dataprep.sources import Chunk, count_lines_before, read_line_range

__all__ = ["BadInputError", "ChunkDocuments", "extract_documents", "load_hf_dataset"]

_MAX_REPORTED = 5  # skipped-line messages kept per chunk for the final summary


class BadInputError(UserError):
    """A line, row or file of the input that cannot be turned into a document."""


@dataclass
class ChunkDocuments:
    """The documents of one chunk: ``texts[key][i]`` is document ``i`` for ``key``."""

    texts: dict[str, list[str]]
    num_skipped: int = 0
    skipped_messages: list[str] = field(default_factory=list)
    text_bytes: int = 0

    @property
    def num_documents(self) -> int:
        return len(next(iter(self.texts.values()))) if self.texts else 0


class _Collector:
    def __init__(self, keys: list[str], skip_bad_lines: bool) -> None:
        self.docs = ChunkDocuments({key: [] for key in keys})
        self.skip_bad_lines = skip_bad_lines

    def bad(self, message: str) -> None:
        if not self.skip_bad_lines:
            raise BadInputError(message)
        self.docs.num_skipped += 1
        if len(self.docs.skipped_messages) < _MAX_REPORTED:
            self.docs.skipped_messages.append(message)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _where(chunk: Chunk, offset: int) -> str:
    """``FILE:LINE`` of line ``offset`` of the chunk (counted from the file's start the first
    time a byte-range chunk needs it: only messages pay for it)."""
    if chunk.first_line == 0:
        chunk.first_line = count_lines_before(chunk.source.path, chunk.start) + 1
    return f"{chunk.source.path}:{chunk.first_line + offset}"


def _json_lines(chunk: Chunk, keys: list[str], out: _Collector) -> None:
    texts = [out.docs.texts[key] for key in keys]
    at = functools.partial(_where, chunk)  # called on bad lines only
    for offset, raw in enumerate(chunk.payload.split(b"\n")):
        if not raw.strip():
            continue  # blank lines (a trailing newline, separators) are not documents
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            out.bad(f"{at(offset)}: not valid UTF-8 (byte {err.start} of the line)")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            hint = " (a JSON array file? bloomline reads one object per line)" if (
                line.lstrip().startswith("[")) else ""
            out.bad(f"{at(offset)}: malformed JSON: {err.msg} at column {err.colno}{hint}")
            continue
        if not isinstance(obj, dict):
            out.bad(f"{at(offset)}: expected a JSON object, got {_type_name(obj)}")
            continue
        values = []
        for key in keys:
            if key not in obj:
                present = ", ".join(repr(k) for k in list(obj)[:8])
                out.bad(f"{at(offset)}: missing key {key!r} (keys present: {present or 'none'}); "
                        "choose the field with --json-key")
                break
            value = obj[key]
            if not isinstance(value, str):
                out.bad(f"{at(offset)}: key {key!r} is {_type_name(value)}, expected a string")
                break
            if "\\ud" in line or "\\uD" in line:  # only JSON escapes can smuggle surrogates in
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    out.bad(f"{at(offset)}: key {key!r} holds an unpaired surrogate escape "
                            "(not valid Unicode)")
                    break
            values.append(value)
        else:
            for column, value in zip(texts, values, strict=True):
                column.append(value)
    out.docs.text_bytes += len(chunk.payload)


def _text_lines(chunk: Chunk, out: _Collector) -> None:
    (texts,) = out.docs.texts.values()
    for offset, raw in enumerate(chunk.payload.split(b"\n")):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            out.bad(f"{_where(chunk, offset)}: not valid UTF-8 (byte {err.start} of the line)")
    out.docs.text_bytes += len(chunk.payload)


def _text_files(chunk: Chunk, out: _Collector) -> None:
    (texts,) = out.docs.texts.values()
    for path in chunk.files:
        with open(path, "rb") as fh:
            raw = fh.read()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            line = raw.count(b"\n", 0, err.start) + 1
            out.bad(f"{path}:{line}: not valid UTF-8 (byte {err.start} of the file)")
            continue
        out.docs.text_bytes += len(raw)


def _require_columns(path: str, keys: list[str], columns: list[str]) -> None:
    missing = [key for key in keys if key not in columns]
    if missing:
        raise BadInputError(f"{path}: no column {missing[0]!r} (columns: "
                            f"{', '.join(columns[:10])}); choose the field with --json-key")


def _table(chunk: Chunk, keys: list[str]):
    """(arrow table of ``keys`` for the chunk, row number of its first row in the source)."""
    path = chunk.source.path
    if chunk.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        _require_columns(path, keys, pf.schema_arrow.names)
        first_row = sum(pf.metadata.row_group(g).num_rows for g in range(chunk.groups[0]))
        return pf.read_row_groups(list(chunk.groups), columns=keys), first_row
    dataset = load_hf_dataset(path)
    _require_columns(path, keys, dataset.column_names)
    return dataset.with_format("arrow")[chunk.start : chunk.stop].select(keys), chunk.start


def _arrow_rows(chunk: Chunk, keys: list[str], out: _Collector) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    table, first_row = _table(chunk, keys)
    path = chunk.source.path
    columns = []
    for key in keys:
        column = table.column(key)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise BadInputError(f"{path}: column {key!r} is {column.type}, expected strings")
        columns.append(column)
    valid = None
    for key, column in zip(keys, columns, strict=True):
        if column.null_count:
            nulls = pc.is_null(column)
            for row in pc.indices_nonzero(nulls).to_pylist():
                out.bad(f"{path}: row {first_row + row}: column {key!r} is null, "
                        "expected a string")
            valid = pc.invert(nulls) if valid is None else pc.and_(valid, pc.invert(nulls))
    for key, column in zip(keys, columns, strict=True):
        kept = column.filter(valid) if valid is not None else column
        out.docs.texts[key].extend(kept.to_pylist())
        out.docs.text_bytes += int(pc.sum(pc.binary_length(kept)).as_py() or 0)


def extract_documents(chunk: Chunk, keys: list[str], skip_bad_lines: bool = False
                      ) -> ChunkDocuments:
    """The texts of every document of ``chunk`` for every key, in input order.

    Text inputs (``.txt``) have no keys: their one text goes under ``keys[0]``.

    Raises:
        BadInputError: at the first bad line unless ``skip_bad_lines``.
    """
    out = _Collector(keys, skip_bad_lines)
    fmt = chunk.source.format
    if chunk.kind == "range":  # read here, in the worker: the lines starting in the range
        payload, first = read_line_range(chunk.source.path, chunk.start, chunk.stop)
        chunk = dataclasses.replace(chunk, kind="lines", payload=payload, start=first)
    if fmt == "txt" and len(keys) > 1:
        raise UserError(f"{chunk.source.path}: text files have no keys; "
                        "give a single --json-key with .txt inputs")
    if chunk.kind == "lines" and fmt == "jsonl":
        _json_lines(chunk, keys, out)
    elif chunk.kind == "lines":
        _text_lines(chunk, out)
    elif chunk.kind == "files":
        _text_files(chunk, out)
    else:
        _arrow_rows(chunk, keys, out)
    return out.docs


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
