"""Blend phases: a train blend whose weights change at given sample positions, in one index.

Mid-training and annealing change the mix during a run. Megatron relaunches per mix; here the
train split's blend is a list of phases ``[(0, weights_0), (start_1, weights_1), ...]`` and one
blend index holds them all, so the trainer's sampler walks the phases without a relaunch.

The rule:

* positions ``[start_k, start_{k+1})`` are chosen by megatron-core's greedy rule
  (``blending.build_blend_indices``) with phase k's weights, counted from the phase's start
  (a dataset of weight 0 in a phase is not drawn in it: the rule runs over the others);
* ``dataset_sample_index`` continues each dataset's running count across the boundaries, so
  every dataset serves its own shuffled order from its first sample on, in order, none
  repeated and none skipped, whatever the phases;
* phase k of a blend of N samples takes ``ceil(L_k * w_kd)`` samples of dataset d at most
  (``L_k`` its length; the last phase ends at N), and dataset d's index is built for the sum
  with megatron-core's surplus, ``ceil(sum_k ceil(L_k * w_kd) * (1 + surplus))``; the blend
  has the middle phases' positions plus ``sum_d ceil(L_last * w_last,d)``.

One phase is megatron-core's blend, byte for byte (``build_index`` keeps its own path for it).
The positions before a phase start do not depend on the phases after it: a run that appends a
phase when it resumes keeps every sample it has seen. Valid and test splits blend with the
first phase's weights: their samples, and so the validation loss, stay comparable over the
whole run, also when a resume appends a phase (the per-dataset losses cover each domain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from bloomline.common.errors import SettingError
from bloomline.dataprep.blending import (
    add_named_weight,
    blended_datasets,
    build_blend_indices,
    normalize_weights,
)
from bloomline.dataprep.setting_names import setting_error

__all__ = ["BlendPhase", "PhasePlan", "check_phases", "drawn_datasets", "format_phases",
           "parse_phase", "phase_plan"]


@dataclass(frozen=True)
class BlendPhase:
    """Weights (by dataset name) in force from train sample ``start`` on."""

    start: int
    weights: Mapping[str, float]


def parse_phase(value: str) -> BlendPhase:
    """``"5000:code=0.1,docs=0.9"`` (``--phase``) -> ``BlendPhase(5000, {...})``."""
    start_text, sep, rest = value.partition(":")
    if not sep:
        raise _phase_error(value, "expected START:NAME=W,NAME=W..., e.g. 5000:code=0.1,docs=0.9")
    try:
        start = int(start_text.replace("_", ""))
    except ValueError:
        raise _phase_error(value, "the start {text!r} is not a sample count",
                           text=start_text) from None
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        add_named_weight(weights, item, partial(_phase_error, value),
                         "{item!r}: expected NAME=WEIGHT")
    if not weights:
        raise _phase_error(value, "no weights after the start")
    return BlendPhase(start, weights)


def _phase_error(value: str, problem: str, **values: object):
    return setting_error("phases", "{setting} {value!r}: " + problem, value=value, **values)


def check_phases(weights: Mapping[str, float] | None, phases: Sequence[BlendPhase],
                 train_samples: int | None, names: list[str]) -> None:
    """The phases after the first (``weights``): starts increasing, above 0 and below the
    train samples; each phase weighs every dataset of the corpus by name (0 leaves it out of
    that phase) by the blend's rule; each dataset drawn by some phase or by none.

    Raises:
        SettingError: about ``phases`` (the entry: the phase's start), one line.
    """
    if not phases:
        return
    if weights is None:
        raise setting_error("phases", "{setting}: phases change the blend weights; give the "
                            "first phase's with {weights} too")
    previous = 0
    for phase in phases:
        start = phase.start
        if start <= previous:
            raise setting_error("phases", "{setting}: phase start {start} must be above the "
                                "previous phase's ({previous}); give the phases in order",
                                entry=str(start), start=start, previous=previous)
        if train_samples is not None and start >= train_samples:
            raise setting_error("phases", "{setting}: phase start {start} is not below "
                                "{train_samples} ({samples}): the phase would never be drawn",
                                entry=str(start), start=start, samples=train_samples)
        previous = start
        unknown = sorted(set(phase.weights) - set(names))
        if unknown:
            raise setting_error("phases", "{setting}: no dataset {name!r} in the corpus (it "
                                "has: {datasets})", entry=str(start), name=unknown[0],
                                datasets=", ".join(names))
        missing = [name for name in names if name not in phase.weights]
        if missing and len(names) > 1:
            raise setting_error("phases", "{setting}: a phase weighs every dataset (0 leaves "
                                "one out of it); missing: {missing}", entry=str(start),
                                missing=", ".join(missing))
        try:
            blended_datasets(phase.weights)
        except SettingError as error:  # the blend's rule, said of this phase
            raise setting_error("phases", "{setting}: {problem}", entry=str(start),
                                problem=str(error).split(": ", 1)[-1]) from None


def drawn_datasets(weights: Mapping[str, float], phases: Sequence[BlendPhase],
                   names: list[str]) -> dict[str, float]:
    """The datasets some phase draws (a weight > 0), in corpus order, with their first
    phase's weight (0 where only a later phase draws them)."""
    blended_datasets({name: weights[name] for name in names})  # the first phase's rule
    drawn = [name for name in names
             if any(w.get(name, 0) > 0 for w in (weights, *(p.weights for p in phases)))]
    return {name: float(weights[name]) for name in drawn}


@dataclass(frozen=True)
class PhasePlan:
    """A split's phases over its blend's datasets (in ``names`` order): where each starts and
    its weights, normalized over the datasets it draws (0 elsewhere)."""

    starts: tuple[int, ...]
    weights: tuple[np.ndarray, ...]

    def lengths(self, num_samples: int) -> list[int]:
        """Samples of each phase within the split's ``num_samples``."""
        return [end - start for start, end in zip(self.starts, (*self.starts[1:], num_samples),
                                                  strict=True)]

    def drawn(self, num_samples: int) -> list[int]:
        """Per dataset: the most the phases take from it, ``sum_k ceil(L_k * w_kd)``."""
        totals = [0] * len(self.weights[0])
        for length, weights in zip(self.lengths(num_samples), self.weights, strict=True):
            for d, weight in enumerate(weights.tolist()):
                totals[d] += int(math.ceil(length * weight))
        return totals

    def component_sizes(self, num_samples: int, surplus: float) -> list[int]:
        """Samples each dataset's index is built for: megatron-core's surplus over the total."""
        return [int(math.ceil(total * (1 + surplus))) for total in self.drawn(num_samples)]

    def size(self, num_samples: int) -> int:
        """Blend positions: the phases before the last, then the last as megatron-core sizes
        a blend (``sum_d ceil(L * w_d)``)."""
        length = num_samples - self.starts[-1]
        last = sum(int(math.ceil(length * w)) for w in self.weights[-1].tolist())
        return self.starts[-1] + last

    def description(self) -> list:
        """The phases as the blend's cache description holds them."""
        return [[start, weights.tolist()] for start, weights in
                zip(self.starts, self.weights, strict=True)]

    def build(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset_index int16, dataset_sample_index int64)`` of ``size`` positions: each
        phase by the greedy rule over the datasets it draws, counted from its start; each
        dataset's sample numbers running on across phases."""
        dataset_index = np.empty(size, dtype=np.int16)
        dataset_sample_index = np.empty(size, dtype=np.int64)
        served = np.zeros(len(self.weights[0]), dtype=np.int64)
        ends = (*self.starts[1:], size)
        for start, end, weights in zip(self.starts, ends, self.weights, strict=True):
            drawn = np.flatnonzero(weights > 0)
            local, local_sample = build_blend_indices(weights[drawn], end - start)
            which = drawn[local.astype(np.int64)]
            dataset_index[start:end] = which
            dataset_sample_index[start:end] = local_sample + served[which]
            served += np.bincount(which, minlength=len(served))
        return dataset_index, dataset_sample_index

    def report(self, dataset_index: np.ndarray, names: list[str]) -> list[dict]:
        """Per phase: its positions, weights and realized shares by dataset name."""
        rows = []
        ends = (*self.starts[1:], len(dataset_index))
        for start, end, weights in zip(self.starts, ends, self.weights, strict=True):
            counts = np.bincount(dataset_index[start:end], minlength=len(names)).tolist()
            rows.append({
                "start": start, "end": end,
                "weights": dict(zip(names, weights.tolist(), strict=True)),
                "counts": dict(zip(names, counts, strict=True)),
                "realized": {name: count / max(1, end - start)
                             for name, count in zip(names, counts, strict=True)}})
        return rows


def phase_plan(weights: Mapping[str, float], phases: Sequence[BlendPhase],
               names: list[str]) -> PhasePlan | None:
    """The phases of a split over ``names`` (``phases`` empty for valid and test: the first
    phase's weights); None when that is one phase drawing every dataset, megatron-core's
    plain blend."""
    all_phases = [BlendPhase(0, weights), *phases]
    vectors = []
    for phase in all_phases:
        given = [float(phase.weights.get(name, 0.0)) for name in names]
        drawn = [w for w in given if w > 0]
        normalized = iter(normalize_weights(drawn).tolist())
        vectors.append(np.asarray([next(normalized) if w > 0 else 0.0 for w in given]))
    if len(all_phases) == 1 and all(vectors[0] > 0):
        return None
    return PhasePlan(tuple(p.start for p in all_phases), tuple(vectors))


def format_phases(phases: list[dict]) -> list[str]:
    """One line per phase: its positions, each dataset's weight and realized share."""
    lines = []
    for number, phase in enumerate(phases):
        shares = ", ".join(f"{name} {weight:.4f} -> {phase['realized'][name]:.4f}"
                           for name, weight in phase["weights"].items())
        lines.append(f"  phase {number} [{phase['start']:,}, {phase['end']:,}): {shares}")
    return lines
