"""Documents out of an Arrow table's string columns: what Parquet files and dataset folders
share. A null, or a value over the limit per document, is a bad row, named as
``FILE: row N``; pyarrow is imported on first use (only jobs with such inputs pay for it)."""

from __future__ import annotations

from bloomline.dataprep.formats.base import BadInputError, DocumentCollector

__all__ = ["arrow_rows", "require_columns"]


def require_columns(path: str, keys: list[str], columns: list[str]) -> None:
    """Raises:
    BadInputError: naming the first key that is not a column."""
    missing = [key for key in keys if key not in columns]
    if missing:
        raise BadInputError(f"{path}: no column {missing[0]!r} (columns: "
                            f"{', '.join(columns[:10])}); choose the field with --json-key")


def arrow_rows(path: str, table, first_row: int, keys: list[str],
               out: DocumentCollector) -> None:
    """Put the ``keys`` columns of ``table`` (whose first row is row ``first_row`` of
    ``path``) into ``out``, skipping rows with a null in any key."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for key in keys:
        column = table.column(key)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise BadInputError(f"{path}: column {key!r} is {column.type}, expected strings")
        columns.append(column)
    valid = None
    for key, column in zip(keys, columns, strict=True):
        # a null is a bad row; so is a value over the limit per document (before any Python
        # string of it is made)
        sizes = pc.binary_length(column)
        big = pc.fill_null(pc.greater(sizes, out.max_document_bytes), False)
        if not (column.null_count or pc.any(big).as_py()):
            continue
        nulls = pc.is_null(column)
        for row in pc.indices_nonzero(nulls).to_pylist():
            out.bad(f"{path}: row {first_row + row}: column {key!r} is null, "
                    "expected a string")
        for row in pc.indices_nonzero(big).to_pylist():
            out.oversized(f"{path}: row {first_row + row}: column {key!r}",
                          sizes[row].as_py(), "value")
        keep = pc.invert(pc.or_(nulls, big))
        valid = keep if valid is None else pc.and_(valid, keep)
    for key, column in zip(keys, columns, strict=True):
        kept = column.filter(valid) if valid is not None else column
        out.docs.texts[key].extend(kept.to_pylist())
        out.docs.text_bytes += int(pc.sum(pc.binary_length(kept)).as_py() or 0)
