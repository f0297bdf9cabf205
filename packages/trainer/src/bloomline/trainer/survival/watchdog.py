"""Hang watchdog: a step (or an evaluation, a checkpoint) that takes far longer than usual dumps
every thread's Python stack to ``RUN/watchdog/rank_R.txt`` and ends the process with exit code
1, so that torchrun (``--max-restarts``) or the scheduler restarts the run from its newest
checkpoint instead of the job idling until its time limit.

A hang in a collective stops every rank in it, so every rank's watchdog fires and each writes
its own stack: the file of the rank stuck elsewhere (in I/O, a sleep, a different collective)
is the one that names the culprit.

The timer is ``faulthandler.dump_traceback_later``: a C thread that needs no GIL, so it fires
even when the main thread is stuck inside a C call that holds the GIL. It is re-armed at the
start of every step with ``max(floor_seconds, factor x median step time)``; before
``_WARM_STEPS`` steps have been timed (compilation, warm-up), and around evaluations and
checkpoints, the limit is ``startup_seconds``.
"""

from __future__ import annotations

import faulthandler
import statistics
import time
from collections import deque
from pathlib import Path

__all__ = ["Watchdog"]

_WARM_STEPS = 5
_HISTORY = 50


class Watchdog:
    """Per-process hang detection around the phases of the training loop."""

    def __init__(self, run_dir: str | Path, rank: int, factor: float, floor_seconds: float,
                 startup_seconds: float, enabled: bool = True) -> None:
        self.enabled = enabled
        self.factor = factor
        self.floor_seconds = floor_seconds
        self.startup_seconds = startup_seconds
        self.path = Path(run_dir) / "watchdog" / f"rank_{rank}.txt"
        self._file = None
        self._times: deque[float] = deque(maxlen=_HISTORY)
        self._armed_at: float | None = None

    @classmethod
    def from_config(cls, cfg, run_dir: str | Path, rank: int) -> Watchdog:
        """From the ``watchdog`` section of the trainer config."""
        w = cfg.watchdog
        return cls(run_dir, rank, w.factor, w.floor_seconds, w.startup_seconds, w.enabled)

    def limit(self) -> float:
        """Seconds the next step may take."""
        if len(self._times) < _WARM_STEPS:
            return self.startup_seconds
        return max(self.floor_seconds, self.factor * statistics.median(self._times))

    def median_step_seconds(self) -> float:
        return statistics.median(self._times) if self._times else 0.0

    def arm(self, what: str, seconds: float | None = None) -> None:
        """Start timing ``what`` (e.g. "step 12"); ``seconds`` overrides the step limit."""
        if not self.enabled:
            return
        limit = self.limit() if seconds is None else seconds
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_file():  # a report of an earlier start of this run: keep it
                stamp = time.strftime("%Y%m%d-%H%M%S",
                                      time.localtime(self.path.stat().st_mtime))
                self.path.rename(self.path.with_name(f"{self.path.stem}-{stamp}.txt"))
            # kept open: faulthandler writes to the descriptor from its own thread
            self._file = open(self.path, "w")  # noqa: SIM115 - closed in close()
        # the header is rewritten at every arm (microseconds): when the timer fires, the file
        # says what hung and for how long, then faulthandler appends the stacks
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"watchdog: {what} took more than {limit:.0f} s "
                         f"(limit: max(watchdog.floor_seconds {self.floor_seconds:g}, "
                         f"watchdog.factor {self.factor:g} x median step "
                         f"{self.median_step_seconds():.3f} s), or watchdog.startup_seconds "
                         f"{self.startup_seconds:g} for the first steps, evaluations and "
                         "checkpoints); the stack of every thread follows. Exit code 1.\n")
        self._file.flush()
        faulthandler.dump_traceback_later(limit, repeat=False, file=self._file, exit=True)
        self._armed_at = time.perf_counter()

    def disarm(self, step_finished: bool = False) -> None:
        """Stop the timer; ``step_finished``: count the time since ``arm`` as a step's."""
        if not self.enabled or self._armed_at is None:
            return
        faulthandler.cancel_dump_traceback_later()
        if step_finished:
            self._times.append(time.perf_counter() - self._armed_at)
        self._armed_at = None

    def close(self) -> None:
        """Disarm and remove the file: a run that ends normally leaves no hang report."""
        self.disarm()
        if self._file is not None:
            self._file.close()
            self._file = None
            self.path.unlink(missing_ok=True)
            try:  # and no empty folder; earlier reports (renamed aside) keep it
                self.path.parent.rmdir()
            except OSError:
                pass
