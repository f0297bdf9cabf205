"""JSON lines: one JSON object per line, the document under each ``--json-key``.

``.jsonl`` and ``.json`` (as in Megatron's ``preprocess_data.py``: one object per line, not an
array), plain or compressed (``.zst``, ``.gz``). Blank lines are not documents.
"""

from __future__ import annotations

import functools
import json

from bloomline.dataprep.formats.base import Chunk, DocumentCollector
from bloomline.dataprep.formats.lines import LineFormat, where

__all__ = ["JSONL"]


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _json_lines(chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
    texts = [out.docs.texts[key] for key in keys]
    at = functools.partial(where, chunk)  # called on bad lines only
    for offset, raw in enumerate(chunk.payload.split(b"\n")):
        if not raw.strip():
            continue  # blank lines (a trailing newline, separators) are not documents
        if out.too_big(len(raw)):
            out.oversized(at(offset), len(raw))
            continue
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
        except RecursionError:  # [[[[...]]]] or {"a": {"a": ...}} nested beyond Python's stack
            out.bad(f"{at(offset)}: JSON nested too deeply to read (thousands of levels of "
                    "arrays or objects)")
            continue
        except ValueError as err:  # a number of more digits than Python converts (4,300)
            out.bad(f"{at(offset)}: unreadable JSON value: {str(err).split(';')[0]}")
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


class JsonLinesFormat(LineFormat):
    """JSON lines files (see the module docstring)."""

    name = "jsonl"
    # longest first where one ends another ("x.jsonl.zst" is not read as ".zst")
    suffixes = {
        ".jsonl.zst": "zst",
        ".json.zst": "zst",
        ".jsonl.gz": "gz",
        ".json.gz": "gz",
        ".jsonl": None,
        ".json": None,
    }

    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        _json_lines(self.read_range(chunk), keys, out)


JSONL = JsonLinesFormat()
