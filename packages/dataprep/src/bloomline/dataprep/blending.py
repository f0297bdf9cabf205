"""Megatron's blend indices (``BlendedDataset``), exactly, compiled with numba.

The rule (``docs/formats/megatron-data.md`` section 4): at position i of the blend, with
t = max(i, 1) and c_d the samples dataset d has given so far, pick the d with the largest
``w_d * t - c_d`` in float64 (ties to the lowest d); ``dataset_index[i] = d``,
``dataset_sample_index[i] = c_d``; then ``c_d += 1``. The *exhaustive* variant (no size given)
draws exactly ``sizes[d]`` samples from each dataset with ``w_d = sizes[d] / sum(sizes)`` and
skips datasets that are spent.

Each step depends on every earlier one (megatron-core runs it as one C++ loop over all
datasets at every step). Two kernels compiled by numba (``kernels.blend``) evaluate the same
float64 expression (no fast-math: no fused multiply-add), so every comparison and pick is
identical:

- *segments* (up to ``SEGMENT_LIMIT`` datasets of mostly distinct weights): the blend is cut
  into segments of ``SEGMENT_LENGTH`` positions and each runs the rule from a *guess* of
  the counts at its start (``w * position``, rounded so they sum to it: the rule keeps
  every count within about one of that). Independent segments break the chain: 24 of them
  run side by side, 8 per SIMD vector (``kernels.blend_simd``), so the CPU overlaps their
  steps. Then ``blend_join`` verifies from the start: where a segment begins, the true
  counts are known (the previous segment's end, once verified); if they differ from its
  guess, the rule runs on from the true counts, rewriting its positions, until the two
  runs' counts are equal, after which the deterministic rule makes the rest of the segment
  right. A guess that never meets costs its segment a sequential rerun, so the result is
  exact in every case; only the time depends on the guesses.
- *wake* (more datasets, or many of equal weight): only datasets whose error can be near
  the top are evaluated. Between two picks a dataset's error grows linearly, so the step
  at which it can reach a level ``lam`` is known in advance; it sleeps in a timing wheel
  until then. If the best awake error is at least ``lam``, no sleeper can beat or tie it;
  otherwise all are evaluated. ``lam`` follows a low quantile of recent winning errors.
  Datasets of equal weight form one group (their errors differ by their counts only, so
  they are served in turn), which keeps exact ties, the worst case for the level, to one
  entry.

``_choose`` picks the kernel from the weights. The kernels module is imported on the first
blend only (numba's import is not free). Measurements: ``docs/perf/dataprep-blend.md``; the
alternatives tried and why numba: ``docs/decisions/dataprep-blend-kernels.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from bloomline.dataprep.setting_names import setting_error

__all__ = [
    "MAX_DATASETS",
    "add_named_weight",
    "blend_component_sizes",
    "blended_datasets",
    "build_blend_indices",
    "build_exhaustive_blend_indices",
    "normalize_weights",
]

# dataset_index is int16 in Megatron's format, and megatron-core asserts fewer than this
MAX_DATASETS = 32767
# up to this many datasets (of mostly distinct weights) every one is evaluated at every step
# (the segment kernel); above, only those that can win (the wake kernel)
SEGMENT_LIMIT = 256
# positions per segment: long enough that verifying its guess (usually a few dozen steps
# rerun) costs nothing, short enough that a blend of 1M samples fills 24 segments
SEGMENT_LENGTH = 1 << 15


def blend_component_sizes(weights: list[float], num_samples: int, surplus: float = 0.0
                          ) -> list[int]:
    """Samples each dataset contributes to (``surplus`` 0) or builds for a blend of N samples.

    Megatron's formula ``int(ceil(ceil(N * w) * (1 + surplus)))`` in Python floats: the
    same float operations in the same order, or a boundary case would differ by one sample.
    """
    return [int(math.ceil(math.ceil(num_samples * weight) * (1 + surplus)))
            for weight in weights]


def add_named_weight(weights: dict[str, float], item: str, fail: Callable[..., Exception],
                     usage: str) -> None:
    """``NAME=WEIGHT`` (``--weight``, an item of ``--phase``) into ``weights``. ``fail(problem,
    **values)`` makes the front end's error, ``usage`` the problem of a malformed item; what
    a weight may be is ``blended_datasets``' rule, checked with the whole request."""
    name, sep, text = item.partition("=")
    if not sep or not name:
        raise fail(usage, item=item)
    try:
        weight = float(text)
    except ValueError:
        raise fail("{text!r} is not a number", text=text) from None
    if name in weights:
        raise fail("{name!r} is weighted twice", name=name)
    weights[name] = weight


def blended_datasets(weights: Mapping[str, float]) -> dict[str, float]:
    """The rule of blend weights given by a user, one for every front end (build-index's
    ``--weight``, the trainer's ``data.weights``): each a finite number >= 0, not all 0, with
    a sum a float64 holds (else every normalized weight would be 0 and the blend empty).
    Weight 0 leaves its dataset out: nothing is built or read for it.

    Returns:
        The weights of the datasets the blend takes samples from, in the given order.

    Raises:
        SettingError: about ``weights`` (the entry at fault where there is one).
    """
    for name, weight in weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise setting_error("weights", "{setting} {value!r}: the weight must be a finite "
                                "number >= 0 (0 leaves the dataset out)", entry=name,
                                value=weight)
    taken = {name: float(weight) for name, weight in weights.items() if weight > 0}
    if not taken:
        raise setting_error("weights", "{setting}: the weights must not all be zero")
    with np.errstate(over="ignore"):  # the sum normalize_weights divides by
        total = np.asarray(list(taken.values()), dtype=np.float64).sum()
    if not np.isfinite(total):
        raise setting_error("weights", "{setting}: the weights add up to more than a float64 "
                            "holds (the largest is {largest:g}); give smaller numbers in the "
                            "same proportions", largest=max(taken.values()))
    return taken


def normalize_weights(weights: list[float]) -> np.ndarray:
    """Weights divided by their float64 sum, as megatron-core's ``normalize`` does.

    Raises:
        ValueError: weights that are not finite and >= 0 with a finite positive sum (user
            weights are checked before, by :func:`blended_datasets`).
    """
    array = np.asarray(weights, dtype=np.float64)
    with np.errstate(over="ignore"):  # an overflow is refused below
        total = array.sum()
    if not (np.isfinite(array).all() and (array >= 0).all() and np.isfinite(total)
            and total > 0):
        raise ValueError(f"blend weights must be finite, >= 0, with a finite positive sum, "
                         f"got {array.tolist()}")
    return array / total


def build_blend_indices(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index int16, dataset_sample_index int64)`` of a blend of ``size`` samples.

    Identical to megatron-core's ``helpers.build_blending_indices`` for the same normalized
    float64 weights.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(weights).all():  # the compiled loops assume it (a NaN never wins)
        raise ValueError(f"blend weights must be finite numbers, got {weights.tolist()}")
    return _greedy(weights, size, limits=None)


def build_exhaustive_blend_indices(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A blend that takes exactly ``sizes[d]`` samples from dataset d, in proportion to sizes.

    Identical to megatron-core's ``helpers.build_exhaustive_blending_indices``.
    """
    limits = np.asarray(sizes, dtype=np.int64)
    total = int(limits.sum())
    weights = limits / np.float64(total)  # int64 / double, as in the C++ helper
    return _greedy(weights, total, limits=limits)


def blend_kernel(weights: np.ndarray, limits: np.ndarray | None = None) -> str:
    """The kernel ``_greedy`` runs for these weights (and per-dataset limits):
    ``"segments"`` or ``"wake"``."""
    weights = np.asarray(weights, dtype=np.float64)
    limit = np.full(len(weights), np.inf) if limits is None else np.asarray(limits, np.float64)
    return _choose(len(weights), len(_groups(weights, limit)[1]))


def _choose(num_datasets: int, num_groups: int) -> str:
    # the segment kernel evaluates every dataset at every step; the wake kernel's bookkeeping
    # pays off beyond a few hundred datasets, or beyond 48 where equal weights make groups of
    # them (measurements: docs/perf/dataprep-blend.md)
    few = num_datasets <= SEGMENT_LIMIT and (2 * num_groups > num_datasets
                                             or num_datasets <= 48)
    return "segments" if few else "wake"


def _groups(weights: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Datasets sorted heaviest first, equal weight and limit adjacent, each group's members
    by ascending index (the order the rule serves them in); and where each group starts."""
    ids = np.arange(len(weights), dtype=np.int64)
    order = np.lexsort((ids, limit, -weights))
    sorted_weights, sorted_limits = weights[order], limit[order]
    new_group = np.ones(len(weights), dtype=bool)
    new_group[1:] = ((sorted_weights[1:] != sorted_weights[:-1])
                     | (sorted_limits[1:] != sorted_limits[:-1]))
    return order, np.flatnonzero(new_group).astype(np.int64)


def _greedy(weights: np.ndarray, size: int, limits: np.ndarray | None,
            kernel: str | None = None, period: int = 4096,
            segment_length: int = SEGMENT_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """The rule over ``size`` steps; ``limits`` (per dataset) for the exhaustive variant.

    ``kernel`` as ``_choose`` picks it unless given; tests force each, a short ``period``
    to exercise the wake kernel's refiling and a short ``segment_length`` to cut many
    segments whose guesses are wrong.
    """
    # numba: imported on the first blend only (see the module docstring)
    from bloomline.dataprep.kernels import blend as blend_kernels

    num_datasets = len(weights)
    dataset_index = np.empty(size, dtype=np.int16)
    dataset_sample_index = np.empty(size, dtype=np.int64)
    if size == 0 or num_datasets == 0:
        return dataset_index, dataset_sample_index
    limit = (np.full(num_datasets, np.inf) if limits is None
             else np.asarray(limits, dtype=np.float64))
    order, start = _groups(weights, limit)
    if (kernel or _choose(num_datasets, len(start))) == "segments":
        lanes = blend_kernels.LANES
        # whole rounds of LANES segments, about segment_length each
        num_segments = lanes * -(-size // (lanes * segment_length))
        length = -(-size // num_segments)
        guess = _guess_counts(weights, limit, np.arange(num_segments) * length)
        end_count = np.empty_like(guess)
        blend_kernels.blend_segments(weights, limit, guess, length, dataset_index,
                                      dataset_sample_index, end_count)
        blend_kernels.blend_join(weights, limit, guess, length, end_count, dataset_index,
                                  dataset_sample_index)
        return dataset_index, dataset_sample_index
    sorted_weights, group_limit = weights[order][start], limit[order][start]
    # rounding of an error (of magnitude <= max|w| * t): a few ulps of size * max|w|;
    # 2**-44 of it is >= 32 times that
    slack = max(1.0, float(np.abs(weights).max())) * (size + 2) * 2.0**-44 + 2.0**-40
    wheel = 1 << int(np.clip(math.ceil(math.log2(8 * len(start))), 10, 16))
    # a full evaluation costs as much as ~all groups awake: about 2 of them per step
    quantile = min(0.05, 2.0 / len(start))
    blend_kernels.blend_wake(
        np.ascontiguousarray(sorted_weights),         # weight
        np.where(group_limit > 0, 0.0, np.inf),       # q: a size-0 dataset is spent
        np.zeros(len(start), dtype=np.int64),         # pos
        order[start],                                 # cand
        start, order,                                 # start, members
        np.diff(np.append(start, num_datasets)),      # num
        np.ascontiguousarray(group_limit), size, slack, wheel, quantile, period,
        dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def _guess_counts(weights: np.ndarray, limit: np.ndarray, positions: np.ndarray
                  ) -> np.ndarray:
    """Counts the rule probably holds at each of ``positions`` (rows): ``weights * position``
    rounded down, then one more for the largest remainders until a row sums to its position
    (as the rule keeps every count within about one of it); capped at ``limit``, a dataset
    that reaches it +inf (spent), as the kernels hold it. Only a guess: ``blend_join``
    verifies it. Row 0 (position 0) is exact: nothing taken, size-0 datasets spent."""
    ideal = weights[None, :] * positions[:, None].astype(np.float64)
    counts = np.minimum(np.floor(ideal), limit[None, :])
    short = positions - counts.sum(axis=1).astype(np.int64)
    remainder = np.where(counts < limit[None, :], ideal - counts, -np.inf)
    order = np.argsort(-remainder, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(len(weights)), order.shape), 1)
    counts += (rank < short[:, None]) & (counts < limit[None, :])
    return np.where(counts >= limit[None, :], np.inf, counts)
