"""Aligned plain-text tables for the human-readable output (``--json`` is for scripts)."""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Lines of ``rows`` (the first is the header): first column left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths, strict=True))
                               ).rstrip()
            for row in rows]
