"""The fixed-width result table the benchmarks print: a header, a rule as long as the header,
one line per row.

Contract: ``cell`` and ``number`` always return exactly ``width`` characters (a missing or NaN
value prints as ``-``), so columns line up whatever the values; ``number`` shows one decimal
below 100 and none above, with thousands separators.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["cell", "number", "print_table"]


def cell(value, fmt: str, width: int = 13) -> str:
    """``value`` formatted by ``fmt`` (which sets the width), or ``-`` right-aligned."""
    return f"{'-':>{width}}" if value is None or math.isnan(value) else format(value, fmt)


def number(value, width: int = 13) -> str:
    """A rate or time: one decimal below 100, none above."""
    return cell(value, f">{width}{',.1f' if value is not None and value < 100 else ',.0f'}",
                width)


def print_table(header: str, lines: Iterable[str]) -> None:
    """An empty line, ``header``, a rule of ``-`` under it and ``lines``."""
    print()
    print(header)
    print("-" * len(header))
    for line in lines:
        print(line)
