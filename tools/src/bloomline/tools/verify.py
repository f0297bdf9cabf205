"""``inspect-data verify``: the full integrity check of a token file or a corpus folder.

The structural checks are dataprep's (:class:`IndexedDataset` on open: header, array sizes,
``.bin`` size, first and last boundary; :meth:`IndexedDataset.verify`: offsets are the prefix
sum of lengths, boundaries never decrease). Added here: every token id is scanned, in chunks,
against the vocabulary size when a tokenizer is given, and the largest id is always reported.
"""

from __future__ import annotations

import os

from bloomline.tools.corpus import open_datasets, scan_token_range
from bloomline.tools.tables import format_table

__all__ = ["format_verify", "verify_corpus"]


def verify_corpus(path: str | os.PathLike, vocab_size: int | None = None,
                  tokenizer_path: str | None = None) -> dict:
    """Check every token file under ``path``; return what was checked.

    Args:
        path: ``corpus/NAME`` or a corpus folder.
        vocab_size: ids must be below it (None: only reported).
        tokenizer_path: named in the error message when an id is too large.

    Raises:
        UserError: (``CorruptTokenFileError``) the first problem found, naming the file.
    """
    where = f" of {tokenizer_path}" if tokenizer_path else ""
    results = {}
    for name, dataset in open_datasets(path).items():
        dataset.verify()
        token_range = scan_token_range(dataset, vocab_size, where)
        results[name] = {"prefix": dataset.path_prefix, "dtype": dataset.dtype.name,
                         "documents": dataset.num_documents, "tokens": dataset.num_tokens,
                         "largest_token_id": token_range.largest}
    checks = ["header", "index size", ".bin size", "offsets", "document boundaries"]
    checks.append(f"token ids < {vocab_size}" if vocab_size is not None else
                  "token ids (largest reported; give --tokenizer to check the vocabulary)")
    return {"path": str(path), "ok": True, "checks": checks, "vocab_size": vocab_size,
            "datasets": results}


def format_verify(result: dict) -> str:
    """``ok`` and the table of what was verified."""
    rows = [["dataset", "documents", "tokens", "dtype", "max id"]]
    for name, row in result["datasets"].items():
        rows.append([name, f"{row['documents']:,}", f"{row['tokens']:,}", row["dtype"],
                     "-" if row["largest_token_id"] is None else str(row["largest_token_id"])])
    return "\n".join([f"{result['path']}: ok ({', '.join(result['checks'])})",
                      *format_table(rows)])
