"""The compiled loops behind ``blending`` (numba); that module's docstring has the rule and
the reasons.

Imported on the first blend build only: importing numba takes a noticeable while, which a
``dataprep`` command that builds no blend should not pay. numba's cache keeps the machine code in
``__pycache__`` (or its user cache folder where that is read-only), so only the first
build on a machine compiles (``kernels.jit``: where neither is writable, every process does).

Every error is the C++ helper's expression ``w * t - c`` in float64, evaluated the same way
(no fast-math flags: no fused multiply-add, no reassociation), so every comparison, and with
it every pick, is the same. Counts are float64 (exact below 2**53), as the C++ loop converts
them for the comparison anyway; a spent dataset's count is +inf, so its error is -inf.

Hot loops are written out rather than calling helpers: a call between compiled functions
passes each array as seven values and costs more than a step. Helpers serve rare paths only.
"""

from __future__ import annotations

import numpy as np

from bloomline.dataprep.kernels.blend_simd import LANES, segment_steps
from bloomline.dataprep.kernels.jit import njit

_FLAGS = {"nogil": True, "boundscheck": False}
_BLOCK = 256  # steps per call of segment_steps: its outputs stay in L1 until written out


@njit(**_FLAGS)
def blend_segments(weight, limit, guess, length, dataset_index, dataset_sample_index,
                   end_count):
    """Segment g (positions ``g * length`` on) run by the rule from the counts ``guess[g]``,
    LANES segments side by side (``kernels.blend_simd``); writes the positions below the blend's
    size and each segment's counts after its ``length`` steps to ``end_count[g]``.
    ``guess.shape[0]`` is a multiple of LANES."""
    datasets, size = weight.size, dataset_index.size
    count = np.empty((datasets, LANES))
    first_t = np.empty(LANES)
    picks = np.empty((_BLOCK, LANES), dtype=np.int64)
    taken = np.empty((_BLOCK, LANES))
    for first in range(0, guess.shape[0], LANES):
        for k in range(LANES):
            for d in range(datasets):
                count[d, k] = guess[first + k, d]
        for offset in range(0, length, _BLOCK):
            steps = min(_BLOCK, length - offset)
            for k in range(LANES):
                first_t[k] = float((first + k) * length + offset)
            segment_steps(count, weight, limit, first_t, steps, picks, taken)
            for k in range(LANES):
                at = (first + k) * length + offset
                for j in range(min(steps, size - at)):
                    dataset_index[at + j] = picks[j, k]
                    dataset_sample_index[at + j] = np.int64(taken[j, k])
        for k in range(LANES):
            for d in range(datasets):
                end_count[first + k, d] = count[d, k]


@njit(**_FLAGS)
def blend_join(weight, limit, guess, length, end_count, dataset_index, dataset_sample_index):
    """Verify ``blend_segments``' output from the start, rewriting what was wrong; returns
    the steps rerun.

    Segment 0 began from the true counts. Where segment g begins, the true counts are known;
    if they equal its guess, its whole run is the rule's. Otherwise the rule runs on from
    the true counts, overwriting the segment's positions, while the segment's own counts are
    followed from its guess and picks; the rule is deterministic, so once the two are equal
    (usually within a few dozen steps) the rest of the segment is the rule's. A segment
    never met is rewritten whole, and the next begins from counts the rule reached itself.
    """
    datasets, size = weight.size, dataset_index.size
    true = end_count[0].copy()
    theirs = np.empty(datasets)
    rerun = 0
    for g in range(1, guess.shape[0]):
        begin, end = g * length, min((g + 1) * length, size)
        if begin >= size:
            break
        theirs[:] = guess[g]
        differ = 0
        for d in range(datasets):
            differ += true[d] != theirs[d]
        i = begin
        while differ > 0 and i < end:
            t = max(float(i), 1.0)
            top = weight[0] * t - true[0]
            for d in range(1, datasets):
                top = max(top, weight[d] * t - true[d])
            best = 0
            while weight[best] * t - true[best] != top:
                best += 1
            their = np.int64(dataset_index[i])
            differ -= (true[best] != theirs[best]) + (their != best
                                                       and true[their] != theirs[their])
            dataset_index[i] = best
            dataset_sample_index[i] = np.int64(true[best])
            true[best] += 1.0
            if true[best] >= limit[best]:
                true[best] = np.inf
            theirs[their] += 1.0
            if theirs[their] >= limit[their]:
                theirs[their] = np.inf
            differ += (true[best] != theirs[best]) + (their != best
                                                      and true[their] != theirs[their])
            i += 1
        rerun += i - begin
        if differ == 0:
            true[:] = end_count[g]
    return rerun


@njit(**_FLAGS)
def _evaluate_all(weight, q, cand, t):
    """The winner among all groups at t: largest error, ties to the lowest dataset."""
    best, best_error, best_cand = 0, -np.inf, np.int64(1 << 62)
    for g in range(weight.size):
        error = weight[g] * t - q[g]
        if error > best_error or (error == best_error and cand[g] < best_cand):
            best, best_error, best_cand = g, error, cand[g]
    return best, best_error


@njit(**_FLAGS)
def _wake_step(w, inverse, q, lam, slack, i, never):
    """The first step after i at which a group's error ``w * t - q`` can reach ``lam``;
    ``never`` if it cannot before the end (spent, or ``w <= 0``: its error never grows).

    Real arithmetic less ``slack`` (the float64 rounding of the error) and less one step
    (the rounding of ``inverse`` = 1 / w and of the product, far below a step): before the
    step returned, the computed error is below lam.
    """
    if q == np.inf:
        return never
    if w <= 0.0:
        return i + 1 if w * max(float(i + 1), 1.0) - q >= lam - slack else never
    at = (q + lam - slack) * inverse  # -inf when lam is
    if at < float(i + 3):
        return i + 1
    if at >= float(never):
        return never
    return np.int64(at) - 1


@njit(**_FLAGS)
def _file_all(weight, inverse, q, lam, slack, i, never, head, nxt, wake, awake, slot):
    """Every group filed anew for level lam after step i; returns how many are awake."""
    wheel = head.size - 1
    boundary = (i + 1) & ~(wheel - 1)
    head[:] = -1
    num_awake = 0
    for g in range(weight.size):
        step = _wake_step(weight[g], inverse[g], q[g], lam, slack, i, never)
        wake[g] = step
        if step <= i + 1:
            slot[g] = num_awake
            awake[num_awake] = g
            num_awake += 1
        else:
            slot[g] = -1
            if step < never:
                b = step & (wheel - 1) if step < boundary + wheel else wheel
                nxt[g] = head[b]
                head[b] = g
    return num_awake


@njit(**_FLAGS)
def blend_wake(weight, q, pos, cand, start, members, num, limit, size, slack, wheel,
               quantile, period, dataset_index, dataset_sample_index):
    """The same picks for many datasets, evaluating only the groups that are *awake*.

    Groups: datasets of equal weight (and size) merged; their errors differ only by their
    counts, so the rule serves them in turn, lowest index first. Per group: ``weight``;
    ``q``, the count of the member served next (+inf when spent); ``pos``, that member's
    place in the group and ``cand`` its dataset index (ties go to the lowest ``cand``); the
    members are ``members[start:start + num]``, ascending; ``limit``, samples per member.

    A group is awake when its error can have reached a level ``lam``. Between its picks a
    group's error grows linearly, so the step at which it can reach ``lam`` again is known
    (``_wake_step``); until then it sleeps in a timing wheel of ``wheel`` slots (a power of
    two; later steps wait in a far list, refiled every ``wheel`` steps). If the best awake
    error is at least ``lam``, every sleeping error is below it, so the best awake group
    is the winner, ties included; otherwise (a few % of steps) every group is evaluated.
    Every ``period`` steps ``lam`` becomes the ``quantile`` of the period's winning errors
    (from a histogram) and every group is filed anew: a low level wakes many groups, a high
    one sends many steps to the full evaluation.
    """
    groups = weight.size
    never = np.int64(size) + 2
    mask = wheel - 1
    head = np.full(wheel + 1, -1, dtype=np.int64)  # singly linked lists: slots, then far
    nxt = np.full(groups, -1, dtype=np.int64)
    wake = np.zeros(groups, dtype=np.int64)
    awake = np.arange(groups)
    slot = np.arange(groups)  # a group's place in awake, -1 asleep
    inverse = 1.0 / np.maximum(weight, 1e-300)
    num_awake = groups
    lam = -np.inf  # all awake until a period has measured the winning errors
    bins, lowest, per_bin = 1024, -4.0, 128.0
    histogram = np.zeros(bins, dtype=np.int64)
    countdown = period
    for i in range(size):
        t = max(float(i), 1.0)
        if (i & mask) == 0 and i > 0:
            # far list: what wakes within the wheel's next round goes to its slot
            g = head[wheel]
            head[wheel] = -1
            while g >= 0:
                following = nxt[g]
                b = wake[g] & mask if wake[g] < i + wheel else wheel
                nxt[g] = head[b]
                head[b] = g
                g = following
        g = head[i & mask]
        head[i & mask] = -1
        while g >= 0:
            slot[g] = num_awake
            awake[num_awake] = g
            num_awake += 1
            g = nxt[g]
        best, best_error, best_cand = -1, -np.inf, np.int64(1 << 62)
        for k in range(num_awake):
            g = awake[k]
            error = weight[g] * t - q[g]
            if error > best_error or (error == best_error and cand[g] < best_cand):
                best, best_error, best_cand = g, error, cand[g]
        if best_error < lam or best_error == -np.inf:
            # the awake groups cannot vouch for the winner. A sleeper served here stays
            # filed: its error only drops, so it wakes early, which is safe.
            best, best_error = _evaluate_all(weight, q, cand, t)
        histogram[int(min(max((best_error - lowest) * per_bin, 0.0), bins - 1.0))] += 1
        # serve position i from group best's next member and move the group on
        dataset_index[i] = cand[best]
        dataset_sample_index[i] = np.int64(q[best])
        p = pos[best] + 1
        if p == num[best]:
            p = 0
            q[best] += 1.0
            if q[best] >= limit[best]:
                q[best] = np.inf
        pos[best] = p
        cand[best] = members[start[best] + p]
        countdown -= 1
        if countdown == 0:
            countdown = period
            seen, b = 0, 0
            for b in range(bins):
                seen += histogram[b]
                if seen > quantile * period:
                    break
            lam = lowest + b / per_bin if b > 0 else -np.inf
            histogram[:] = 0
            num_awake = _file_all(weight, inverse, q, lam, slack, i, never, head, nxt, wake,
                                  awake, slot)
            continue
        if slot[best] < 0:
            continue
        # the winner sleeps until its error can reach lam again (_wake_step written out)
        w, qb = weight[best], q[best]
        if qb == np.inf:
            step = never
        elif w <= 0.0:
            step = i + 1 if w * max(float(i + 1), 1.0) - qb >= lam - slack else never
        else:
            at = (qb + lam - slack) * inverse[best]
            step = i + 1 if at < float(i + 3) else (
                never if at >= float(never) else np.int64(at) - 1)
        if step > i + 1:
            k = slot[best]
            num_awake -= 1
            last = awake[num_awake]
            awake[k] = last
            slot[last] = k
            slot[best] = -1
            wake[best] = step
            if step < never:
                b = step & mask if step < ((i + 1) & ~mask) + wheel else wheel
                nxt[best] = head[b]
                head[b] = best
