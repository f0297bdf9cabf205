"""A dependency-free progress line with rates and an ETA, fit for terminals and log files.

On a terminal it redraws one line (at most 5 times a second); when stderr is a file or a pipe
(CI, nohup, SLURM logs) it prints a full line every ``log_interval`` seconds instead, so that
logs stay readable.

Every number carries its unit, rates included: ``5.46k docs (4.72k docs/s)``; byte counts
take the prefix their size calls for: ``63 B``, ``12.3 kB``, ``3.45 MB (2.99 MB/s)``. The
total behind the percentage and the ETA may be an estimate (on-disk bytes that the work does
not consume exactly), so the percentage stops at 99% until :meth:`Progress.close` says the
work is done, and the last line says ``100%`` and ``done``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

__all__ = ["BYTES", "Counter", "Progress", "format_duration", "format_quantity"]


BYTES = "B"
"""The label of a counter of bytes: shown as B, kB, MB, GB, TB by size."""


@dataclass(frozen=True)
class Counter:
    """One quantity shown with its rate: ``key`` is what :meth:`Progress.update` adds to,
    ``label`` the unit after the number (``docs``, ``tokens``, or :data:`BYTES`)."""

    key: str
    label: str


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1:02:05``; ``65`` -> ``1:05``."""
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0))


def _scaled(value: float) -> tuple[str, str]:
    """(number, SI prefix) with three significant digits at most and never an exponent:
    ``1234567`` -> ``("1.23", "M")``, ``999.7`` -> ``("1", "k")``, ``0.004`` -> ``("<0.01", "")``.
    """
    if value != 0 and abs(value) < 0.01:
        return ("<0.01" if value > 0 else "-<0.01"), ""
    # the prefix of the rounded value: 999.7 shows as 1k, not 1e+03
    rounded = abs(float(f"{value:.3g}"))
    for prefix, factor in _PREFIXES:
        if rounded >= factor or not prefix:
            return f"{value / factor:.3g}", prefix
    raise AssertionError("unreachable")


def _human(value: float) -> str:
    """Three significant digits at most: ``1234567`` -> ``1.23M``, ``812.1`` -> ``812``."""
    number, prefix = _scaled(value)
    return number + prefix


def format_quantity(value: float, label: str) -> str:
    """``value`` with its unit: ``1.2k docs``, ``3.45 MB`` (``label`` :data:`BYTES`)."""
    number, prefix = _scaled(value)
    if label == BYTES:
        return f"{number} {prefix}B"
    return f"{number}{prefix} {label}"


class Progress:
    """Counts that grow over a job, printed with their rate and, when a total is known, an ETA.

    Args:
        description: shown at the start of the line.
        counters: the quantities to show, each with its per-second rate.
        total: the final value of ``total_key`` if known (e.g. input bytes), for % and ETA.
        total_key: which counter ``total`` refers to.
        stream: where to print (stderr by default).
        enabled: False makes every call a no-op (``--quiet``).
        log_interval: seconds between lines when ``stream`` is not a terminal.
    """

    def __init__(
        self,
        description: str,
        counters: list[Counter],
        total: float | None = None,
        total_key: str | None = None,
        stream: TextIO | None = None,
        enabled: bool = True,
        log_interval: float = 10.0,
    ) -> None:
        self.description = description
        self.counters = counters
        self.total = total
        self.total_key = total_key
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.values = {c.key: 0.0 for c in counters}
        if total_key is not None:
            self.values.setdefault(total_key, 0.0)
        self._is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._interval = 0.2 if self._is_tty else log_interval
        self._start = time.perf_counter()
        self._last_print = self._start

    @property
    def elapsed(self) -> float:
        """Seconds since the progress started."""
        return time.perf_counter() - self._start

    def update(self, **increments: float) -> None:
        """Add to the counters and redraw if enough time has passed."""
        for key, inc in increments.items():
            self.values[key] = self.values.get(key, 0.0) + inc
        now = time.perf_counter()
        if self.enabled and now - self._last_print >= self._interval:
            self._last_print = now
            self._emit(final=False)

    def render(self, final: bool = False, done: bool = False) -> str:
        """The current line, e.g. ``tokenize 42% | 1.2k docs (300 docs/s) | ... | ETA 0:12``.
        A ``final`` line has no ETA; with ``done`` (the work is complete) it says ``100%`` and
        ``done``."""
        elapsed = max(self.elapsed, 1e-9)
        parts = [self.description]
        fraction = None
        if self.total and self.total_key is not None:
            # the total may be an estimate: only the end of the work is 100%
            fraction = 1.0 if done else min(0.99, self.values[self.total_key] / self.total)
            parts[0] += f" {int(100 * fraction):3d}%"
        for c in self.counters:
            value = self.values[c.key]
            parts.append(f"{format_quantity(value, c.label)} "
                         f"({format_quantity(value / elapsed, c.label)}/s)")
        parts.append(format_duration(elapsed))
        if done:
            parts.append("done")
        elif not final and fraction is not None and 0 < fraction < 0.99:
            parts.append(f"ETA {format_duration(elapsed * (1 - fraction) / fraction)}")
        return " | ".join(parts)

    def _emit(self, final: bool, done: bool = False) -> None:
        line = self.render(final, done)
        if self._is_tty:
            end = "\n" if final else ""
            self.stream.write(f"\r\033[K{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, done: bool = True) -> None:
        """Print the final state once: ``done`` when the work is complete (100%, no ETA),
        else the fraction reached (a job that stops early)."""
        if self.enabled:
            self._emit(final=True, done=done)
            self.enabled = False
