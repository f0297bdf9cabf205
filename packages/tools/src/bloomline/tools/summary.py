"""``inspect-data summary``: what a token file (or a corpus folder) holds, at a glance.

Everything comes from the index (lengths, boundaries) except the largest token id, which is
the one figure that needs the whole ``.bin``: one sequential, chunked scan.
"""

from __future__ import annotations

import os

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.indexed_dataset import IndexedDataset
from bloomline.tools.corpus import document_lengths, open_datasets, scan_token_range
from bloomline.tools.tables import format_table

__all__ = ["PERCENTILES", "format_summary", "summarize", "summarize_dataset"]

PERCENTILES = (1, 10, 25, 50, 75, 90, 99)


def _length_stats(lengths: np.ndarray) -> dict:
    if not lengths.size:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "max": None}
    # "inverted_cdf" picks real document lengths (order statistics), not interpolated ones
    values = np.percentile(lengths, PERCENTILES, method="inverted_cdf")
    return {"mean": float(lengths.mean()),
            **{f"p{q}": int(v) for q, v in zip(PERCENTILES, values, strict=True)},
            "max": int(lengths.max())}


def summarize_dataset(dataset: IndexedDataset) -> dict:
    """Counts, length percentiles, file sizes and the format check of one token file.

    The format check is :meth:`IndexedDataset.verify` (offsets, boundaries) on top of the
    checks opening already did; its failure is reported in ``format``, not raised, so the
    rest of the summary is still shown.
    """
    try:
        dataset.verify()
        fmt = "ok"
    except UserError as err:
        fmt = str(err)
    lengths = document_lengths(dataset)
    token_range = scan_token_range(dataset)
    return {
        "prefix": dataset.path_prefix,
        "dtype": dataset.dtype.name,
        "documents": dataset.num_documents,
        "sequences": len(dataset),
        "tokens": dataset.num_tokens,
        "empty_documents": int(np.count_nonzero(lengths == 0)),
        "largest_token_id": token_range.largest,
        "smallest_token_id": token_range.smallest,
        "document_tokens": _length_stats(lengths),
        "bin_bytes": dataset.bin_path.stat().st_size,
        "idx_bytes": dataset.idx_path.stat().st_size,
        "format": fmt,
        "_lengths": lengths,  # for the folder total; dropped before printing
    }


def summarize(path: str | os.PathLike) -> dict:
    """The summary of ``corpus/NAME`` or of every token file of a corpus folder.

    Returns:
        ``{"path", "datasets": {name: summary}, "total": summary of all (folders only),
        "ok": every format check passed}``.
    """
    rows = {name: summarize_dataset(ds) for name, ds in open_datasets(path).items()}
    result: dict = {"path": str(path), "datasets": rows}
    if os.path.isdir(path) and len(rows) > 1:
        lengths = np.concatenate([row["_lengths"] for row in rows.values()])
        largest = [row["largest_token_id"] for row in rows.values()
                   if row["largest_token_id"] is not None]
        result["total"] = {
            "datasets": len(rows),
            "documents": sum(row["documents"] for row in rows.values()),
            "tokens": sum(row["tokens"] for row in rows.values()),
            "empty_documents": sum(row["empty_documents"] for row in rows.values()),
            "largest_token_id": max(largest) if largest else None,
            "document_tokens": _length_stats(lengths),
            "bin_bytes": sum(row["bin_bytes"] for row in rows.values()),
            "idx_bytes": sum(row["idx_bytes"] for row in rows.values()),
        }
    for row in rows.values():
        del row["_lengths"]
    result["ok"] = all(row["format"] == "ok" for row in rows.values())
    return result


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""  # unreachable


def format_summary(result: dict) -> str:
    """The summary as a table (one row per file, a total row for folders)."""
    stats = ["mean", *(f"p{q}" for q in PERCENTILES), "max"]
    header = ["dataset", "documents", "tokens", "dtype", "max id", "empty", *stats,
              ".bin", ".idx"]
    rows = [header]
    named = list(result["datasets"].items())
    if "total" in result:
        named.append(("TOTAL", {**result["total"], "dtype": ""}))
    for name, row in named:
        lengths = row["document_tokens"]
        rows.append([
            name, f"{row['documents']:,}", f"{row['tokens']:,}", row["dtype"],
            "-" if row["largest_token_id"] is None else str(row["largest_token_id"]),
            f"{row['empty_documents']:,}",
            *("-" if lengths[key] is None else
              (f"{lengths[key]:.1f}" if key == "mean" else f"{lengths[key]:,}") for key in stats),
            _bytes(row["bin_bytes"]), _bytes(row["idx_bytes"])])
    lines = [f"{result['path']}: document lengths in tokens"]
    lines += format_table(rows)
    for name, row in result["datasets"].items():
        lines.append(f"format {name}: {row['format']}" if row["format"] != "ok" else
                     f"format {name}: ok (MMIDIDX v1, offsets and boundaries consistent)")
    return "\n".join(lines)
