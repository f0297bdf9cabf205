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

The watchdog belongs to a run: it times only between :meth:`Watchdog.start` and
:meth:`Watchdog.close` (``Trainer.run``, through the run guard), so a save or a step called
outside a run (a test, a script that builds a ``Trainer`` to write a checkpoint) creates no
file that nothing would remove. While something is timed the file holds a header naming it and
its limit; it becomes a hang report only when the timer fires and faulthandler appends its
``Timeout`` line and the stacks. A process that dies otherwise while timing (SIGKILL, the OOM
killer, torchrun ending the other ranks) leaves the header alone, which says nothing hung, and
the next start of the run removes it; a real report is kept, renamed aside.
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
# what faulthandler writes first when its timer fires (CPython: "Timeout (H:MM:SS)!")
_FIRED = "\nTimeout ("


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
        self._running = False

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

    def start(self) -> None:
        """Begin the run's watchdog: from here to :meth:`close`, :meth:`arm` times. The file an
        earlier start of the run left is kept, renamed aside, if its timer fired (a hang
        report); removed if not (its process was killed while timing: nothing hung)."""
        if not self.enabled:
            return
        if self.path.is_file():
            if _FIRED in self.path.read_text(errors="replace"):
                stamp = time.strftime("%Y%m%d-%H%M%S",
                                      time.localtime(self.path.stat().st_mtime))
                self.path.rename(self.path.with_name(f"{self.path.stem}-{stamp}.txt"))
            else:  # the folder stays: another rank may be creating its file in it now
                self.path.unlink()
        self._running = True

    def arm(self, what: str, seconds: float | None = None) -> None:
        """Start timing ``what`` (e.g. "step 12"); ``seconds`` overrides the step limit.
        Nothing outside :meth:`start` .. :meth:`close`."""
        if not self.enabled or not self._running:
            return
        limit = self.limit() if seconds is None else seconds
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # kept open: faulthandler writes to the descriptor from its own thread
            self._file = open(self.path, "w")  # noqa: SIM115 - closed in close()
        # the header is rewritten at every arm (microseconds): when the timer fires, the file
        # says what hung and for how long, then faulthandler appends the stacks. It claims no
        # hang itself: a process killed while timing leaves it behind
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"watchdog: timing {what} with a limit of {limit:.0f} s "
                         f"(max(watchdog.floor_seconds {self.floor_seconds:g}, "
                         f"watchdog.factor {self.factor:g} x median step "
                         f"{self.median_step_seconds():.3f} s), or watchdog.startup_seconds "
                         f"{self.startup_seconds:g} for the first steps, evaluations and "
                         "checkpoints). If it hangs, faulthandler's Timeout line and the stack "
                         "of every thread follow and the process exits with code 1; with "
                         f"nothing below, the process ended otherwise during {what} (killed): "
                         "nothing hung.\n")
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
        """Disarm and end the run's watchdog; remove the file: a run that ends normally
        leaves no hang report."""
        self.disarm()
        self._running = False
        if self._file is not None:
            self._file.close()
            self._file = None
            self.path.unlink(missing_ok=True)
            try:  # and no empty folder; earlier reports (renamed aside) keep it
                self.path.parent.rmdir()
            except OSError:
                pass
