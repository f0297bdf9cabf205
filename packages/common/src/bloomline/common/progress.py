"""A dependency-free progress line with rates and an ETA, fit for terminals and log files.

On a terminal it redraws one line (at most 5 times a second); when stderr is a file or a pipe
(CI, nohup, SLURM logs) it prints a full line every ``log_interval`` seconds instead, so that
logs stay readable.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Counter", "Progress", "format_duration"]


@dataclass(frozen=True)
class Counter:
    """One quantity shown with its rate: ``key`` is what :meth:`Progress.update` adds to."""

    key: str
    label: str
    scale: float = 1.0  # shown value = raw / scale (e.g. 1e6 for MB)


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1:02:05``; ``65`` -> ``1:05``."""
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _human(value: float) -> str:
    """Three significant digits at most: ``1234567`` -> ``1.23M``, ``812.1`` -> ``812``."""
    for unit, factor in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{unit}"
    return f"{value:.3g}"


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

    def render(self) -> str:
        """The current line, e.g. ``tokenize 42% | 1.20k docs (300/s) | ... | ETA 0:12``."""
        elapsed = max(self.elapsed, 1e-9)
        parts = [self.description]
        fraction = None
        if self.total and self.total_key is not None:
            fraction = min(1.0, self.values[self.total_key] / self.total)
            parts[0] += f" {100 * fraction:3.0f}%"
        for c in self.counters:
            value = self.values[c.key] / c.scale
            parts.append(f"{_human(value)} {c.label} ({_human(value / elapsed)}/s)")
        parts.append(format_duration(elapsed))
        if fraction is not None and 0 < fraction < 1:
            parts.append(f"ETA {format_duration(elapsed * (1 - fraction) / fraction)}")
        return " | ".join(parts)

    def _emit(self, final: bool) -> None:
        line = self.render()
        if self._is_tty:
            end = "\n" if final else ""
            self.stream.write(f"\r\033[K{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Print the final state once."""
        if self.enabled:
            self._emit(final=True)
            self.enabled = False
