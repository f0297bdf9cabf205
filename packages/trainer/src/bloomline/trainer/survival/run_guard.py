"""What keeps a long run alive, in one place the training loop consults at each step: the spike
detector (``spikes.py``), the stop requests of signals and the wall-clock budget
(``preemption.py``), the hang watchdog (``watchdog.py``), the heartbeat that names a rank
that stops answering (``heartbeat.py``) and the count of bad (non-finite) steps; and, for the
run's life, the run folder's lock (``run_folder.py``: one trainer per run folder).

``RunGuard.judge`` is the one point where the ranks agree: each rank's finding (a spike or a
non-finite value) and stop request go through a single all-reduce (max), so every rank of every
parallel layout rolls back, or stops and saves, after the same step. Without it a rank whose
SIGUSR1 arrived alone would save while the others went on into the next step's collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bloomline.common.errors import UserError
from bloomline.trainer.survival.heartbeat import Heartbeat
from bloomline.trainer.survival.preemption import StopRequests
from bloomline.trainer.survival.run_folder import RunLock
from bloomline.trainer.survival.spikes import SpikeDetector, SpikeFinding
from bloomline.trainer.survival.watchdog import Watchdog

__all__ = ["RunGuard", "Verdict"]


@dataclass
class Verdict:
    """The agreed outcome of a step: a finding to roll back from, and a reason to stop."""

    finding: SpikeFinding | None = None
    stop_reason: str = ""


class RunGuard:
    """Spike detection, stop requests and the watchdog of one rank's run."""

    def __init__(self, cfg, run_dir, rank: int) -> None:
        self.spike_enabled = cfg.spike.enabled
        self.detector = SpikeDetector.from_config(cfg.spike)
        self.stops = StopRequests(cfg.train.max_wallclock)
        self.watchdog = Watchdog.from_config(cfg, run_dir, rank)
        self.heartbeat = Heartbeat.from_config(cfg, rank)
        self.lock = RunLock(run_dir, is_holder=rank == 0)
        self.last_save_seconds = 0.0
        self.max_bad_steps = cfg.train.max_bad_steps

    def start(self) -> None:
        """Take the run folder's lock (collective; a UserError when another trainer holds
        it), then catch the stop signals and start the watchdog (which times nothing before:
        a save outside a run leaves no file behind)."""
        self.lock.acquire()
        self.stops.begin_setup()  # the loop's first step calls begin_training
        self.stops.install()
        self.watchdog.start()
        self.heartbeat.start()

    def close(self) -> None:
        try:
            self.heartbeat.close()
            self.stops.uninstall()
            self.watchdog.close()
        finally:
            self.lock.release()

    def judge(self, result: dict) -> Verdict:
        """This step's verdict, the same on every rank. Good steps join the spike baseline."""
        finding = self.detector.check(result["loss"], result["grad_norm"])
        if finding is not None and finding.reason != "non-finite" and not self.spike_enabled:
            finding = None  # without rollbacks a finite spike changes nothing
        # room for the next step and the checkpoint after it, with a margin for noise
        reserve = 2.0 * self.watchdog.median_step_seconds() + 1.5 * self.last_save_seconds
        reason = self.stops.local_reason(reserve)
        spiked, stop = self.stops.agree([float(finding is not None), float(bool(reason))])
        if spiked and finding is None:  # another rank's values tripped it
            finding = SpikeFinding("spike on another rank", result["loss"], float("nan"),
                                   float("nan"))
        if stop and not reason:
            reason = "another rank was asked to stop (signal or train.max_wallclock)"
        if finding is None:
            self.detector.record(result["loss"], result["grad_norm"])
        return Verdict(finding, reason)

    def count_bad(self, state, result: dict, step: int, loss_scaled: bool, log) -> None:
        """Count a skipped step in ``state`` (a ``TrainState``); a good step ends a streak.
        An fp16 overflow (``loss_scaled`` and a finite loss) is expected, the scaler backs
        off: it counts as skipped, not as bad.

        Raises:
            UserError: more than ``train.max_bad_steps`` bad steps in a row.
        """
        if not result["skipped"]:
            state.count_good()
            return
        bad = not (loss_scaled and math.isfinite(result["loss"]))
        streak = state.count_skipped(bad)
        if not bad:
            return
        log(f"step {step}: non-finite loss {result['loss']} or gradient norm "
            f"{result['grad_norm']}; step skipped ({streak} in a row)")
        if streak > self.max_bad_steps:
            raise UserError(f"stopping: {streak} consecutive steps with a "
                            f"non-finite loss or gradient (train.max_bad_steps = "
                            f"{self.max_bad_steps}); lower optimizer.lr or resume "
                            "from an earlier checkpoint")
