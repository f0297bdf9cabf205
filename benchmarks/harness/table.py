"""The fixed-width result table the benchmarks print: a header, a rule as long as the header,
one line per row.

Contract: ``cell`` and ``number`` always return exactly ``width`` characters (a missing or NaN
value prints as ``-``), so columns line up whatever the values; ``number`` shows one decimal
below 100 and none above, with thousands separators.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from benchmarks.harness.paths import REPO

__all__ = ["cell", "number", "print_table", "write_result"]


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


def write_result(out: str, header: str, lines: list[str]) -> None:
    """Write the header and the printed lines to ``out`` (relative to the repository), the
    results file a benchmark's ``--out`` names; an empty ``out`` writes nothing."""
    if not out:
        return
    path = REPO / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    print(f"wrote {out}")
