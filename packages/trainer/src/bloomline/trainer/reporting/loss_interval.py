"""The train loss a log line reports: the mean over the steps since the previous log line, as
Megatron's ``training_log`` prints it (its losses summed over the interval and divided by the
iterations that advanced: a skipped step's loss, non-finite or an fp16 overflow's, is left
out). One step's loss is noisy (a batch of code after one of prose reads as a jump); the
mean is the curve. The last step's loss goes beside it (``loss_last``); the spike detector
never reads either: it judges each step's own loss (``survival/``).

The interval restarts after each log line, after a rollback (the steps after the checkpoint
are trained again) and with each process (a resume's first interval holds only its own
steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LossInterval"]


@dataclass
class LossInterval:
    """The losses of the steps since the interval began."""

    total: float = 0.0
    steps: int = 0  # the steps that advanced (not skipped): the mean is over these
    seen: int = 0  # every step added, skipped ones too
    last: float = math.nan

    def add(self, loss: float, skipped: bool) -> None:
        """A step's loss; ``skipped``: the step was not applied (its loss is not summed)."""
        self.last, self.seen = loss, self.seen + 1
        if not skipped:
            self.total += loss
            self.steps += 1

    def mean(self) -> float:
        """The mean loss of the steps that advanced; the last step's when none did (every
        step of the interval skipped: its non-finite loss is the news)."""
        return self.total / self.steps if self.steps else self.last

    def record(self, step_loss: float) -> dict[str, float | int]:
        """``loss`` (the mean), ``loss_last`` (the last step's) and ``loss_steps`` (the
        steps the mean is over) for a train record; ``step_loss``, the step's own result,
        stands for all three when no step was added (a record made outside the loop)."""
        if not self.seen:
            return {"loss": step_loss, "loss_last": step_loss, "loss_steps": 1}
        return {"loss": self.mean(), "loss_last": self.last, "loss_steps": self.steps}
