"""``inspect-data verify``: the full integrity check of a token file or a corpus folder.

The structural checks are dataprep's (:class:`IndexedDataset` on open: header, an integer
token dtype, array sizes, ``.bin`` size, boundaries from 0 to S never decreasing, lengths never
negative, offsets the running sum of the lengths). Added here: every token id is scanned, in
chunks, against the vocabulary size when a tokenizer is given, and the largest id is always
reported; for a corpus folder, every entry of its index cache (``CORPUS/.index``) is checked
against the token files it was built from (:func:`check_index_cache`: what the trainer's load
checks, without building anything).
"""

from __future__ import annotations

import os
from pathlib import Path

from bloomline.dataprep.index_checks import check_index_cache
from bloomline.tools.corpus import open_datasets, scan_token_range
from bloomline.tools.tables import format_table

__all__ = ["format_verify", "verify_corpus"]


def verify_corpus(path: str | os.PathLike, vocab_size: int | None = None,
                  tokenizer_path: str | None = None,
                  cache_dir: str | os.PathLike | None = None) -> dict:
    """Check every token file under ``path``; return what was checked.

    Args:
        path: ``corpus/NAME`` or a corpus folder.
        vocab_size: ids must be below it (None: only reported).
        tokenizer_path: named in the error message when an id is too large.
        cache_dir: the index cache to check (default: ``PATH/.index`` of a folder; none for
            a single file unless given).

    Raises:
        UserError: (``CorruptTokenFileError``) the first problem found, naming the file.
    """
    where = f" of {tokenizer_path}" if tokenizer_path else ""
    results = {}
    datasets = open_datasets(path)
    for name, dataset in datasets.items():
        token_range = scan_token_range(dataset, vocab_size, where)
        results[name] = {"prefix": dataset.path_prefix, "dtype": dataset.dtype.name,
                         "documents": dataset.num_documents, "tokens": dataset.num_tokens,
                         "largest_token_id": token_range.largest}
    checks = ["header", "index size", ".bin size", "offsets", "document boundaries"]
    checks.append(f"token ids < {vocab_size}" if vocab_size is not None else
                  "token ids (largest reported; give --tokenizer to check the vocabulary)")
    if cache_dir is None and Path(path).is_dir():
        cache_dir = Path(path) / ".index"
    cache = None
    if cache_dir is not None:
        cache = {"path": str(cache_dir), **check_index_cache(cache_dir, datasets)}
        if cache["checked"] or cache["stale"]:
            stale = f", {cache['stale']} stale skipped" if cache["stale"] else ""
            entries = "entry" if cache["checked"] == 1 else "entries"
            checks.append(f"index cache ({cache['checked']} {entries}{stale})")
    return {"path": str(path), "ok": True, "checks": checks, "vocab_size": vocab_size,
            "datasets": results, "index_cache": cache}


def format_verify(result: dict) -> str:
    """``ok`` and the table of what was verified."""
    rows = [["dataset", "documents", "tokens", "dtype", "max id"]]
    for name, row in result["datasets"].items():
        rows.append([name, f"{row['documents']:,}", f"{row['tokens']:,}", row["dtype"],
                     "-" if row["largest_token_id"] is None else str(row["largest_token_id"])])
    return "\n".join([f"{result['path']}: ok ({', '.join(result['checks'])})",
                      *format_table(rows)])
