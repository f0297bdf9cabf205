"""The compiled loops behind ``gpt_samples`` (numba), for large indices only: the same
arrays as numpy's and Megatron's, several times faster.

``shuffle_mt19937`` is ``numpy.random.RandomState.shuffle`` of a 1-D array: the same swaps
from the same Mersenne Twister draws, so the same permutation and the same generator state
after. Every builder of Megatron's indices must shuffle the document index (documents x
epochs entries) and the shuffle index with ``RandomState(seed)``; those shuffles were most of
a 10-epoch build. numpy's loop is general: per element an indirect call for each 32-bit draw
and three ``memcpy`` calls of a run-time item size for the swap, each swap waiting on the
next draw. Here the draws of a block of positions come first, then the block's swaps, which
touch random entries of a large array: independent loads the CPU overlaps.

The rule, from numpy's ``_shuffle_raw`` and ``random_interval`` (legacy RandomState): for i
from n - 1 down to 1, j = the first 32-bit draw ``& mask`` that is <= i (mask: the smallest
2**k - 1 >= i), then swap entries i and j. (numpy draws 64 bits for i >= 2**32: arrays that
long are left to numpy.) Draws are MT19937's ``genrand_int32`` over the generator's 624-word key.

``sample_starts`` is Megatron's ``build_sample_idx`` loop, one pass over the document index
(numpy's closed form in ``gpt_samples._sample_starts`` makes ~10 passes and int64
temporaries).

Imported only when an index is large (``gpt_samples``): importing numba costs ~0.3 s, as much
as these loops save on ~10M entries. ``cache=True`` keeps the machine code (in
``__pycache__``, or numba's user cache folder where that is read-only), so only a machine's
first build compiles (~1 s per token dtype).
"""

from __future__ import annotations

import numba
import numpy as np

_N, _M = 624, 397
_MATRIX_A, _UPPER, _LOWER = 0x9908B0DF, 0x80000000, 0x7FFFFFFF
_BLOCK = 2048  # positions whose draws are made before their swaps (16 KiB of j)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _next_word(word, following, far):
    """One word of MT19937's twist: ``word``'s top bit and ``following``'s other 31."""
    y = (np.uint32(word) & np.uint32(_UPPER)) | (np.uint32(following) & np.uint32(_LOWER))
    return np.uint32(far) ^ (y >> np.uint32(1)) ^ (np.uint32(_MATRIX_A) * (y & np.uint32(1)))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _twist(key):
    """MT19937's next 624 words, in place (``mt19937_gen``): three loops, so no index wraps."""
    for i in range(_N - _M):
        key[i] = _next_word(key[i], key[i + 1], key[i + _M])
    for i in range(_N - _M, _N - 1):
        key[i] = _next_word(key[i], key[i + 1], key[i + _M - _N])
    key[_N - 1] = _next_word(key[_N - 1], key[0], key[_M - 1])


@numba.njit(cache=True, nogil=True, boundscheck=False)
def shuffle_mt19937(array, key, pos):
    """Shuffle ``array`` (under 2**32 entries) in place as ``RandomState.shuffle`` does from
    the state (``key``, a writable uint32[624] copy, and ``pos``); returns the new ``pos``
    (``key`` is updated)."""
    n = array.shape[0]
    draws = np.empty(_BLOCK, dtype=np.int64)
    i = n - 1
    while i >= 1:
        count = min(_BLOCK, i)
        for t in range(count):  # the draws of positions i, i - 1, ..., i - count + 1
            top = np.uint64(i - t)
            mask = top
            mask |= mask >> np.uint64(1)
            mask |= mask >> np.uint64(2)
            mask |= mask >> np.uint64(4)
            mask |= mask >> np.uint64(8)
            mask |= mask >> np.uint64(16)
            while True:
                if pos == _N:
                    _twist(key)
                    pos = 0
                y = np.uint32(key[pos])
                pos += 1
                y ^= y >> np.uint32(11)
                y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
                y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
                y ^= y >> np.uint32(18)
                value = np.uint64(y) & mask
                if value <= top:
                    break
            draws[t] = np.int64(value)
        for t in range(count):  # the swaps, in the same order as numpy's
            m = i - t
            j = draws[t]
            held = array[j]
            array[j] = array[m]
            array[m] = held
        i -= count
    return pos


@numba.njit(cache=True, nogil=True, boundscheck=False)
def sample_starts(sequence_lengths, document_index, seq_length, rows, extra):
    """Megatron's ``build_sample_idx`` loop: row j = (position k of the document index where
    token j * L lies, its offset in that document). With the extra token a start on a
    document's end belongs to the next position; without it, it stays on the ending one as
    (k, len_k), as Megatron's loop leaves it."""
    k = 0
    before = 0  # tokens before position k
    end = np.int64(sequence_lengths[document_index[0]])
    for j in range(rows.shape[0]):
        target = np.int64(j) * seq_length
        while end < target or (extra and end == target):
            k += 1
            before = end
            end += np.int64(sequence_lengths[document_index[k]])
        rows[j, 0] = k
        rows[j, 1] = target - before
