"""Ranges of train samples never trained on, and the sample position with them.

The trainer reads the train split in Megatron's order, and its ``consumed_samples`` counter is a
*position* in that order: the next sample to read. Skip ranges are half-open ``[start, end)``
ranges of positions (``train.skip_samples``, plus one per rollback); reading jumps over them.
A step that takes ``n`` samples moves the position past ``n`` samples that are not skipped, so
the skipped samples count as consumed: the run still ends at ``train.train_samples``, the LR
schedule and batch rampup (which follow the position) go on from where the data is, and the
order of every sample that is read is unchanged (the same as Megatron would read them).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

__all__ = ["SkipRanges"]


class SkipRanges:
    """Sorted, merged ``[start, end)`` ranges of sample positions."""

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        self._ranges: list[tuple[int, int]] = []
        for start, end in ranges:
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        """Skip ``[start, end)`` too (overlapping and touching ranges merge)."""
        if end <= start:
            return
        merged = []
        for first, last in self._ranges:
            if last < start or first > end:
                merged.append((first, last))
            else:
                start, end = min(start, first), max(end, last)
        merged.append((start, end))
        self._ranges = sorted(merged)

    def to_list(self) -> list[list[int]]:
        return [[start, end] for start, end in self._ranges]

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def _past(self, position: int) -> int:
        """``position``, or the end of the range it falls in."""
        index = bisect.bisect_right(self._ranges, (position, float("inf"))) - 1
        if index >= 0 and self._ranges[index][0] <= position < self._ranges[index][1]:
            return self._ranges[index][1]
        return position

    def _next_start(self, position: int) -> float:
        index = bisect.bisect_right(self._ranges, (position, float("inf")))
        return self._ranges[index][0] if index < len(self._ranges) else float("inf")

    def advance(self, position: int, count: int) -> int:
        """The position after reading ``count`` samples from ``position``."""
        while count > 0:
            position = self._past(position)
            take = int(min(count, self._next_start(position) - position))
            position += take
            count -= take
        return position

    def positions(self, position: int, stop: int) -> Iterator[int]:
        """The positions read from ``position`` on, below ``stop``."""
        while True:
            position = self._past(position)
            run_end = int(min(self._next_start(position), stop))
            if position >= stop:
                return
            yield from range(position, run_end)
            position = run_end
