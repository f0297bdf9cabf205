"""Megatron's blend indices (``BlendedDataset``), computed without a Python loop over samples.

The rule (``shared/specs/megatron-data.md`` section 4): at position i of the blend, with
t = max(i, 1) and c_d the samples dataset d has given so far, pick the d with the largest
``w_d * t - c_d`` in float64 (ties to the lowest d); ``dataset_index[i] = d``,
``dataset_sample_index[i] = c_d``; then ``c_d += 1``. The *exhaustive* variant (no size given)
draws exactly ``sizes[d]`` samples from each dataset with ``w_d = sizes[d] / sum(sizes)`` and
skips datasets that are spent.

Each step depends on every earlier one, so megatron-core runs it as a sequential C++ loop that
has to be compiled on rank 0. Here it runs as *lanes*, vectorized with numpy:

1. The blend is cut into P lanes of equal length. Lane 0 starts from the true state (all
   counts zero); every other lane starts from a guess of the counts at its first position
   (the largest-remainder rounding of ``w * position``, which is usually right or close).
2. All lanes take their steps together, one numpy operation over (P, datasets) per step,
   evaluating the exact float64 expression above, so every lane follows the true rule from
   whatever state it starts in.
3. Each lane then runs on into its successor's range, comparing its counts with the
   successor's at every step. The rule is deterministic, so once the two states are equal
   the successor is on the true trajectory from there on; the few positions before that are
   taken from the predecessor. This is how correctness chains from lane 0 to the last lane.
4. A lane that has not met its successor after a full lane length (seen only with hundreds of
   tiny weights) ends the round: everything before it is exact, and a new round starts there
   from the now-known true state. The result is therefore exact in every case; only the time
   depends on how quickly guesses meet.

The cost is ~(lane length) Python steps plus O(samples x datasets) vectorized work, the same
order as the C++ loop, with nothing to compile. A compiled JIT helper (numba) was the other
option; it would add a 50 MB dependency and a compile on first use for a loop numpy can carry.
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
_LANE_LENGTH = 8192


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
    return _greedy(weights, size, limits=None)


def build_exhaustive_blend_indices(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A blend that takes exactly ``sizes[d]`` samples from dataset d, in proportion to sizes.

    Identical to megatron-core's ``helpers.build_exhaustive_blending_indices``.
    """
    limits = np.asarray(sizes, dtype=np.int64)
    total = int(limits.sum())
    weights = limits / np.float64(total)  # int64 / double, as in the C++ helper
    return _greedy(weights, total, limits=limits)


def _guess_counts(weights: np.ndarray, positions: np.ndarray,
                  limits: np.ndarray | None) -> np.ndarray:
    """Largest-remainder rounding of ``weights * position``: counts that sum to the position.

    Only a starting guess; the lanes verify it (see the module docstring).
    """
    ideal = weights[None, :] * positions[:, None].astype(np.float64)
    counts = np.floor(ideal)
    if limits is not None:
        counts = np.minimum(counts, limits[None, :])
    short = positions - counts.sum(axis=1).astype(np.int64)
    remainder = ideal - counts
    if limits is not None:
        remainder[counts >= limits[None, :]] = -np.inf
    order = np.argsort(-remainder, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(weights.size), order.shape), 1)
    return counts + (rank < short[:, None])


def _greedy(weights: np.ndarray, size: int, limits: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray]:
    # long lanes amortize Python's per-step overhead over many samples, short ones keep small
    # blends from paying for thousands of steps: about 20k (lane, dataset) cells per step
    lane_length = int(np.clip(size * len(weights) // 20_000, 256, _LANE_LENGTH))
    lane_length = max(1, min(lane_length, size))
    # padded to whole lanes so that each lane's range is one row of a (lanes, length) view
    padded = -(-size // lane_length) * lane_length
    dataset_index = np.empty(padded, dtype=np.int16)
    dataset_sample_index = np.empty(padded, dtype=np.int64)
    start = 0
    counts_at_start = np.zeros(weights.size, dtype=np.float64)
    while start < size:
        start, counts_at_start = _run_lanes(weights, limits, size, lane_length, start,
                                            counts_at_start, dataset_index,
                                            dataset_sample_index)
    return dataset_index[:size], dataset_sample_index[:size]


def _run_lanes(weights: np.ndarray, limits: np.ndarray | None, size: int, lane_length: int,
               start: int, counts_at_start: np.ndarray, dataset_index: np.ndarray,
               dataset_sample_index: np.ndarray) -> tuple[int, np.ndarray]:
    """One round of lanes over ``[start, size)``; returns where the next round must start
    (``size`` when everything is verified) and the true counts there."""
    num_lanes = -(-(size - start) // lane_length)
    num_datasets = len(weights)
    lane_starts = start + np.arange(num_lanes, dtype=np.int64) * lane_length
    # counts as float64: exact for integers below 2**53, and the subtraction below then needs
    # no conversion (the C++ helper converts each count to double the same way). Laid out
    # (datasets, lanes) so that the per-dataset passes of the argmax read contiguous rows.
    counts = np.ascontiguousarray(_guess_counts(weights, lane_starts, limits).T)
    counts[:, 0] = counts_at_start
    guessed = counts[:, 1:].copy()
    flat_counts = counts.reshape(-1)
    lanes = np.arange(num_lanes, dtype=np.int64)
    spent = None if limits is None else limits[:, None].astype(np.float64)
    error = np.empty_like(counts)
    best = np.empty(num_lanes)
    picks = np.zeros(num_lanes, dtype=np.int64)
    flat = np.empty(num_lanes, dtype=np.int64)
    t = np.empty(num_lanes)
    # steps are buffered in blocks, contiguous per step, and moved to the output lane-major
    block = _Block(num_lanes, lane_length,
                   dataset_index[start : start + num_lanes * lane_length],
                   dataset_sample_index[start : start + num_lanes * lane_length])
    met_at = np.full(num_lanes - 1, -1, dtype=np.int64)  # successor's step where states meet
    successor_length = np.minimum(lane_length, size - lane_starts[1:])
    overlap_picks, overlap_counts = [], []
    for step in range(2 * lane_length):
        if step >= lane_length:
            if step == lane_length:
                block.flush()
            # counts of lane b at its step lane_length + u vs lane b+1's at its step u
            u = step - lane_length
            waiting = met_at < 0
            meets = waiting & ((counts[:, :-1] == guessed).all(axis=0) | (u >= successor_length))
            # having run over the successor's whole (short) range counts as meeting at its end
            met_at[meets] = np.minimum(u, successor_length[meets])
            if not waiting[~meets].any():
                break
            successor_steps = np.minimum(lane_starts[1:] + u, size - 1)
            guessed[dataset_index[successor_steps], lanes[:-1]] += 1
        np.maximum(lane_starts + step, 1, out=t, casting="unsafe")
        np.multiply(weights[:, None], t[None, :], out=error)
        np.subtract(error, counts, out=error)
        if spent is not None:
            error[counts >= spent] = -np.inf
        _argmax_columns(error, picks, best)
        np.multiply(picks, num_lanes, out=flat)
        flat += lanes
        taken = flat_counts[flat]
        flat_counts[flat] = taken + 1
        if step < lane_length:
            block.add(picks, taken)
        else:
            overlap_picks.append(picks[:-1].astype(np.int16))
            overlap_counts.append(taken[:-1].astype(np.int64))
    else:
        block.flush()
    failed = np.flatnonzero(met_at < 0)
    verified = len(met_at) if len(failed) == 0 else int(failed[0])
    if overlap_picks:
        # positions of lane b+1 before the meeting come from lane b's run into its range
        stacked_picks = np.stack(overlap_picks, axis=1)
        stacked_counts = np.stack(overlap_counts, axis=1)
        for lane in np.flatnonzero(met_at[:verified] > 0):
            n = int(met_at[lane])
            first = int(lane_starts[lane + 1])
            dataset_index[first : first + n] = stacked_picks[lane, :n]
            dataset_sample_index[first : first + n] = stacked_counts[lane, :n]
    if len(failed) == 0:
        return size, counts_at_start
    # lane `verified` is exact; it ended its own range at the next lane's start
    next_start = int(lane_starts[verified + 1])
    true_counts = np.bincount(dataset_index[:next_start], minlength=num_datasets)
    return next_start, true_counts.astype(np.float64)


def _argmax_columns(error: np.ndarray, picks: np.ndarray, best: np.ndarray) -> None:
    """Per column, the first row holding the maximum (ties to the lowest dataset, like the
    C++ helper's strict ``>`` scan).

    For a few datasets a running comparison over contiguous rows is several times faster
    than ``argmax(axis=0)``.
    """
    if error.shape[0] > 32:
        np.argmax(error, axis=0, out=picks)
        return
    best[:] = error[0]
    picks[:] = 0
    for dataset in range(1, error.shape[0]):
        better = error[dataset] > best
        np.copyto(best, error[dataset], where=better)
        np.copyto(picks, dataset, where=better)


class _Block:
    """Steps of all lanes, buffered step-major and copied to the lane-major output in blocks
    (one strided copy per block instead of a scattered write per step)."""

    STEPS = 64

    def __init__(self, num_lanes: int, lane_length: int, dataset_index: np.ndarray,
                 dataset_sample_index: np.ndarray) -> None:
        self.picks = np.empty((self.STEPS, num_lanes), dtype=np.int16)
        self.taken = np.empty((self.STEPS, num_lanes), dtype=np.int64)
        self.outputs = (dataset_index.reshape(num_lanes, lane_length),
                        dataset_sample_index.reshape(num_lanes, lane_length))
        self.first_step = 0
        self.used = 0

    def add(self, picks: np.ndarray, taken: np.ndarray) -> None:
        self.picks[self.used] = picks
        self.taken[self.used] = taken
        self.used += 1
        if self.used == self.STEPS:
            self.flush()

    def flush(self) -> None:
        first, n = self.first_step, self.used
        for buffer, output in zip((self.picks, self.taken), self.outputs, strict=True):
            output[:, first : first + n] = buffer[:n].T
        self.first_step += n
        self.used = 0
