"""Statistics over benchmark rounds.

Why medians of per-round ratios: the machines these run on are shared and their speed drifts
between minutes, so a ratio is taken within one round (both sides under the same drift) and
the median over rounds is reported.
"""

from __future__ import annotations

import statistics

__all__ = ["median", "ratio"]


def median(values):
    """The median of ``values``, or None when there are none."""
    return statistics.median(values) if values else None


def ratio(numerators, denominators):
    """The median of per-round ratios (rounds paired by position; a zero denominator's round
    is left out), or None when no round has one."""
    pairs = [a / b for a, b in zip(numerators, denominators, strict=True) if b]
    return statistics.median(pairs) if pairs else None
