"""The run's clock: time since the run started, and the time left from the recent steps.

The ETA is the mean time per step over the last ``recent`` steps times the steps left. Those
intervals run from one step's end to the next, so evaluations and checkpoint saves, which
recur, are counted in their share; the first step of the process is not (it ends the
start-up: the first batch, compilation, the kernels' warm-up), unless it is the only one.
"""

from __future__ import annotations

import time
from collections import deque

__all__ = ["RunClock", "format_hms", "now"]

_clock = time.perf_counter  # a name of its own: tests drive the run's times with a fake clock


def now() -> float:
    """The clock of the run's elapsed time, ETA and throughput (``time.perf_counter``)."""
    return _clock()


def format_hms(seconds: float | None) -> str:
    """``3725`` -> ``1:02:05``, ``65`` -> ``0:01:05`` (always h:mm:ss); None -> ``?``."""
    if seconds is None:
        return "?"
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class RunClock:
    """Elapsed time since ``started`` (a ``now()`` reading: when the trainer began building
    the run) and the ETA. ``steps_begin`` before the first step, then
    ``step_ended`` after each one."""

    def __init__(self, started: float | None = None, recent: int = 50) -> None:
        self.started = now() if started is None else started
        self._ends: deque[float] = deque(maxlen=recent + 1)
        self._first_begin: float | None = None

    def elapsed(self) -> float:
        return now() - self.started

    def steps_begin(self) -> None:
        """The step loop starts (the first step's time is measured from here)."""
        self._first_begin = now()
        self._ends.clear()

    def step_ended(self) -> None:
        self._ends.append(now())

    def seconds_per_step(self) -> float | None:
        """Mean of the recent steps after the first; the first step's own time while it is
        the only one; None before any step."""
        ends = self._ends
        if len(ends) >= 2:
            return (ends[-1] - ends[0]) / (len(ends) - 1)
        if ends and self._first_begin is not None:
            return ends[0] - self._first_begin
        return None

    def eta(self, steps_left: int) -> float | None:
        """Seconds until ``steps_left`` more steps are done, at the recent pace."""
        per_step = self.seconds_per_step()
        return None if per_step is None else per_step * max(steps_left, 0)
