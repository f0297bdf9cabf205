"""Loss-spike detection against a robust running baseline.

The baseline is the median of the last ``spike.window`` steps' losses (and gradient norms), and
their spread the MAD scaled to a normal standard deviation (x 1.4826). Median and MAD rather
than a mean and standard deviation, or an EMA: the spike itself, and the ones before it, do not
drag the baseline up, and the steady fall of the loss early in training (all values below the
median) never looks like a spike. A finite value is a spike when it is above both
``median + zscore x MAD`` (statistically out of line) and a material rise over the median
(``loss_rise``, ``grad_norm_factor``): a run whose loss barely moves has a tiny MAD, and a
0.1% wiggle there must not trigger a rollback. A non-finite loss or gradient norm is always a
finding.

The history is part of the trainer state (saved in every checkpoint), so a resumed or rolled
back run judges the next steps exactly as the uninterrupted run would.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["SpikeDetector", "SpikeFinding"]

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation


@dataclass
class SpikeFinding:
    """Why a step is bad: ``reason`` (non-finite, loss spike, grad-norm spike), the value that
    tripped it, the baseline median and the threshold it crossed."""

    reason: str
    value: float
    baseline: float
    threshold: float

    def describe(self) -> str:
        if self.reason == "non-finite":
            return f"non-finite loss or gradient norm ({self.value})"
        return (f"{self.reason}: {self.value:.4g} against a baseline of {self.baseline:.4g} "
                f"(threshold {self.threshold:.4g})")


class SpikeDetector:
    """Judges each step's loss and gradient norm against the last ``window`` good steps."""

    def __init__(self, window: int, min_history: int, zscore: float, loss_rise: float,
                 grad_norm_factor: float) -> None:
        self.min_history = min_history
        self.zscore = zscore
        self.loss_rise = loss_rise
        self.grad_norm_factor = grad_norm_factor
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)
        # (median, sigma) of each history until it changes: a step is checked twice, by the
        # recompute's verdict inside the step and by the run guard after it
        self._stats: dict[str, tuple[float, float]] = {}

    @classmethod
    def from_config(cls, cfg) -> SpikeDetector:
        """From the ``spike`` section of the trainer config."""
        return cls(cfg.window, cfg.min_history, cfg.zscore, cfg.loss_rise, cfg.grad_norm_factor)

    def check(self, loss: float, grad_norm: float) -> SpikeFinding | None:
        """The finding for this step's values, or None when they look normal."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return SpikeFinding("non-finite", loss if not math.isfinite(loss) else grad_norm,
                                math.nan, math.nan)
        if len(self.losses) < self.min_history:
            return None
        finding = self._outlier("loss spike", loss, self.losses,
                                lambda median: median * (1.0 + self.loss_rise))
        if finding is None and self.grad_norm_factor > 0:
            finding = self._outlier("grad-norm spike", grad_norm, self.grad_norms,
                                    lambda median: median * self.grad_norm_factor)
        return finding

    def _outlier(self, reason: str, value: float, history, material) -> SpikeFinding | None:
        if reason not in self._stats:
            values = np.fromiter(history, dtype=np.float64)
            median = float(np.median(values))
            self._stats[reason] = (
                median, _MAD_TO_SIGMA * float(np.median(np.abs(values - median))))
        median, sigma = self._stats[reason]
        threshold = max(median + self.zscore * sigma, material(median))
        return SpikeFinding(reason, value, median, threshold) if value > threshold else None

    def record(self, loss: float, grad_norm: float) -> None:
        """Add a good step to the baseline (spikes are never added)."""
        self.losses.append(float(loss))
        self.grad_norms.append(float(grad_norm))
        self._stats.clear()

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms)}

    def load_state_dict(self, state: dict) -> None:
        self._stats.clear()
        self.losses.clear()
        self.grad_norms.clear()
        self.losses.extend(state.get("losses", []))
        self.grad_norms.extend(state.get("grad_norms", []))
