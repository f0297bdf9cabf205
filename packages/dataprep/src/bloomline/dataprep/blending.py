"""Megatron's blend indices (``BlendedDataset``), exactly, compiled with numba.

The rule (``shared/specs/megatron-data.md`` section 4): at position i of the blend, with
t = max(i, 1) and c_d the samples dataset d has given so far, pick the d with the largest
``w_d * t - c_d`` in float64 (ties to the lowest d); ``dataset_index[i] = d``,
``dataset_sample_index[i] = c_d``; then ``c_d += 1``. The *exhaustive* variant (no size given)
draws exactly ``sizes[d]`` samples from each dataset with ``w_d = sizes[d] / sum(sizes)`` and
skips datasets that are spent.

Each step depends on every earlier one. megatron-core runs it as a C++ loop over all datasets
at every step (~1.2 ns per dataset and step on the 2-vCPU EPYC dev machine). Here two loops
compiled by numba (``_blend_kernels``) evaluate the same float64 expression (no fast-math: no
fused multiply-add), so every comparison and pick is identical:

- *scan* (up to ``SCAN_LIMIT`` datasets of mostly distinct weights): every error at every
  step, as the C++ loop, but the maximum over four independent chains without a branch, then
  the first dataset that holds it (the C++ loop's running maximum is a branch per dataset
  that goes either way; at 3-10 datasets this is 1.3-3x faster).
- *wake* (more datasets): only datasets whose error can be near the top are evaluated. Between
  two picks a dataset's error grows linearly, so the step at which it can reach a level
  ``lam`` is known in advance; it sleeps in a timing wheel until then. If the best awake error
  is at least ``lam``, no sleeper can beat or tie it; otherwise (a few % of steps) all are
  evaluated. ``lam`` follows a low quantile of recent winning errors. Datasets of equal
  weight form one group (their errors differ by their counts only, so they are served in
  turn), which keeps exact ties, the worst case for the level, to one entry.

Why numba, measured (``make bench-build-index``, its blend rows: 10M samples, lognormal
weights, median of 5 rounds, wall time ours / megatron-core's; one other core busy):
3 datasets 0.34x, 10: 0.78x, 30: 0.87x, 100: 0.70x, 500: 0.24x, all identical; on a quiet
machine 0.36x, 1.08x, 0.66x, 0.61x, 0.19x. At 10 datasets this is parity, not a win: each
step waits on the previous pick's count (~15 ns a step for both loops), and branchless
variants of the pick (an index kept per chain: 1.4x the scan's time; the first holder of the
maximum found without a branch: 1.7x; two steps per iteration, since step t + 1's errors
but the winner's do not depend on step t's pick: 1.8x) and the wake kernel (1.8x) were
slower there. The numpy
"lanes" this module had before (steps of ~1,000 blend lanes at once, verified by meeting)
were 1.6x (3 datasets), 4.3x (10), 4.9x (30) and 2.3x (100) megatron-core's time: each step
costs a dozen numpy calls over (lanes x datasets) temporaries, several passes of what the C++
loop does once, so no lane count closes that gap at 3-30 datasets. A C extension would need a
compiler at install. Cost of numba 0.68.1 (manylinux wheels, no compiler): ~210 MB installed
(llvmlite's LLVM library is 170 MB of it; the wheels download 64 MB); ``import numba`` ~0.3 s,
paid on the first blend only (the kernels module is imported lazily); compiling both kernels
on a machine's first blend ~2.3 s (0.7 s scan, 1.6 s wake); ``cache=True`` stores the machine
code in ``__pycache__`` (numba's user cache where that is read-only), so later processes load
it in ~0.01 s. Tried and dropped: SIMD scans (numba's float ``max`` does not vectorize, not
even with fast-math; LLVM's ``maxnum`` through an intrinsic does, but ran no faster on loops
of 30-100), and bounds over blocks of datasets sorted by weight (slower than the scan at 30
and 100 datasets, 2x the wake kernel's time at 500). At 16-64 datasets of distinct weights
both kernels stay near the C++ loop's speed
(0.85x-1.0x, depending on the weights): the scan does the same work per dataset, and the wake
kernel's bookkeeping costs about what it skips.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "MAX_DATASETS",
    "blend_component_sizes",
    "build_blend_indices",
    "build_exhaustive_blend_indices",
]

# dataset_index is int16 in Megatron's format, and megatron-core asserts fewer than this
MAX_DATASETS = 32767
# up to this many datasets every one is evaluated at every step; above, only the awake
SCAN_LIMIT = 48


def blend_component_sizes(weights: list[float], num_samples: int, surplus: float = 0.0
                          ) -> list[int]:
    """Samples each dataset contributes to (``surplus`` 0) or builds for a blend of N samples.

    Megatron's formula ``int(ceil(ceil(N * w) * (1 + surplus)))`` in Python floats: the
    same float operations in the same order, or a boundary case would differ by one sample.
    """
    return [int(math.ceil(math.ceil(num_samples * weight) * (1 + surplus)))
            for weight in weights]


def normalize_weights(weights: list[float]) -> np.ndarray:
    """Weights divided by their float64 sum, as megatron-core's ``normalize`` does."""
    array = np.asarray(weights, dtype=np.float64)
    return array / array.sum()


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


def _greedy(weights: np.ndarray, size: int, limits: np.ndarray | None,
            scan_limit: int = SCAN_LIMIT, period: int = 4096
            ) -> tuple[np.ndarray, np.ndarray]:
    """The rule over ``size`` steps; ``limits`` (per dataset) for the exhaustive variant.

    The scan kernel for up to ``scan_limit`` datasets of mostly distinct weights, the wake
    kernel otherwise (tests force each, and a short ``period`` to exercise the wake kernel's
    refiling).
    """
    from bloomline.dataprep import _blend_kernels

    num_datasets = len(weights)
    dataset_index = np.empty(size, dtype=np.int16)
    dataset_sample_index = np.empty(size, dtype=np.int64)
    if size == 0 or num_datasets == 0:
        return dataset_index, dataset_sample_index
    limit = (np.full(num_datasets, np.inf) if limits is None
             else np.asarray(limits, dtype=np.float64))
    ids = np.arange(num_datasets, dtype=np.int64)
    # groups: equal weight and limit, heaviest first; members by ascending index, the order
    # the rule serves them in
    order = np.lexsort((ids, limit, -weights))
    sorted_weights, sorted_limits = weights[order], limit[order]
    new_group = np.ones(num_datasets, dtype=bool)
    new_group[1:] = ((sorted_weights[1:] != sorted_weights[:-1])
                     | (sorted_limits[1:] != sorted_limits[:-1]))
    start = np.flatnonzero(new_group).astype(np.int64)
    if num_datasets <= scan_limit and 2 * len(start) > num_datasets:
        padded = -(-num_datasets // 4) * 4
        weight = np.zeros(padded)
        weight[:num_datasets] = weights
        count = np.full(padded, np.inf)  # the padding's error is -inf: never picked
        count[:num_datasets] = np.where(limit > 0, 0.0, np.inf)  # a size-0 dataset is spent
        _blend_kernels.blend_scan(weight, count, np.pad(limit, (0, padded - num_datasets)),
                                  size, dataset_index, dataset_sample_index)
        return dataset_index, dataset_sample_index
    group_limit = np.ascontiguousarray(sorted_limits[start])
    # rounding of an error (of magnitude <= max|w| * t): a few ulps of size * max|w|;
    # 2**-44 of it is >= 32 times that
    slack = max(1.0, float(np.abs(weights).max())) * (size + 2) * 2.0**-44 + 2.0**-40
    wheel = 1 << int(np.clip(math.ceil(math.log2(8 * len(start))), 10, 16))
    # a full evaluation costs as much as ~all groups awake: about 2 of them per step
    quantile = min(0.05, 2.0 / len(start))
    _blend_kernels.blend_wake(
        np.ascontiguousarray(sorted_weights[start]),  # weight
        np.where(group_limit > 0, 0.0, np.inf),       # q: a size-0 dataset is spent
        np.zeros(len(start), dtype=np.int64),         # pos
        order[start],                                 # cand
        start, order,                                 # start, members
        np.diff(np.append(start, num_datasets)),      # num
        group_limit, size, slack, wheel, quantile, period, dataset_index,
        dataset_sample_index)
    return dataset_index, dataset_sample_index
