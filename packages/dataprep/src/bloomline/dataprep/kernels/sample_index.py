"""The compiled loops behind ``gpt_index`` and ``gpt_samples`` (numba), for large indices
only: the same arrays as numpy's and Megatron's, faster (``docs/perf/dataprep-index-kernels.md``).

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
(numpy's closed form in ``gpt_index._sample_starts`` makes several passes and int64
temporaries).

Imported only when an index is large (``gpt_index``) or a batch is read
(``gpt_samples.get_batch``): importing numba costs about what these loops save on a
mid-sized index. numba's cache keeps the machine code (in
``__pycache__``, or its user cache folder where that is read-only), so only a machine's
first build compiles (once per token dtype; ``kernels.jit``: where neither folder is
writable, every process does).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from bloomline.dataprep.kernels.jit import njit

_N, _M = 624, 397
_MATRIX_A, _UPPER, _LOWER = 0x9908B0DF, 0x80000000, 0x7FFFFFFF
_BLOCK = 2048  # positions whose draws are made before their swaps (16 KiB of j)


@njit(nogil=True, boundscheck=False, inline="always")
def _next_word(word, following, far):
    """One word of MT19937's twist: ``word``'s top bit and ``following``'s other 31."""
    y = (np.uint32(word) & np.uint32(_UPPER)) | (np.uint32(following) & np.uint32(_LOWER))
    return np.uint32(far) ^ (y >> np.uint32(1)) ^ (np.uint32(_MATRIX_A) * (y & np.uint32(1)))


@njit(nogil=True, boundscheck=False)
def _twist(key):
    """MT19937's next 624 words, in place (``mt19937_gen``): three loops, so no index wraps."""
    for i in range(_N - _M):
        key[i] = _next_word(key[i], key[i + 1], key[i + _M])
    for i in range(_N - _M, _N - 1):
        key[i] = _next_word(key[i], key[i + 1], key[i + _M - _N])
    key[_N - 1] = _next_word(key[_N - 1], key[0], key[_M - 1])


@njit(nogil=True, boundscheck=False)
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


@njit(nogil=True, boundscheck=False)
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


@intrinsic
def _copy_bytes(typingctx, destination, destination_byte, source, source_byte, size):
    """memcpy ``size`` bytes between two arrays' buffers at byte offsets. numba's slice
    assignment copies element by element, which keeps a few cache lines of a run in flight
    where memcpy's wide loads keep the whole run (measurements:
    ``docs/perf/dataprep-index-kernels.md``)."""
    signature = types.void(destination, types.intp, source, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        to = context.make_array(signature.args[0])(context, builder, args[0])
        fro = context.make_array(signature.args[2])(context, builder, args[2])
        to_pointer = builder.gep(builder.bitcast(to.data, cgutils.voidptr_t), [args[1]])
        from_pointer = builder.gep(builder.bitcast(fro.data, cgutils.voidptr_t), [args[3]])
        cgutils.raw_memcpy(builder, to_pointer, from_pointer, args[4], 1)
        return context.get_dummy_value()

    return signature, codegen


@njit(nogil=True, boundscheck=False)
def gather_samples(ids, rows, batch, shuffle, sample_index, document_index, pointers, lengths,
                   tokens, itemsize, extra):
    """Samples ``ids`` of one dataset into the C-contiguous ``batch`` (row ``rows[r]`` for
    ``ids[r]``, row r when ``rows`` is empty), as ``GPTSampleDataset.__getitem__`` reads them:
    from (position, offset) of the sample-index row through the next row's, plus the extra
    token, copied run by run from the token file (``pointers`` in bytes). Negative ids count
    from the end.

    Compiled without bounds checks, so every index read from an array is checked here before
    it is used: a damaged or foreign index (shuffle entry, sample-index row, document id,
    offset) cannot make the loop read outside its arrays or the token file, whatever the
    values. (``pointers`` and ``lengths`` are the token file's, checked when it was opened:
    each sequence lies inside the file.)

    Returns -1; r >= 0 when ``ids[r]`` is out of range; -2 - r when sample ``ids[r]`` does
    not fill exactly one row or its index entries point outside the arrays or the token file
    (an index made for another file or L, or damaged). Nothing is written from that sample on.
    """
    num_samples = shuffle.shape[0]
    num_rows = sample_index.shape[0]
    num_positions = document_index.shape[0]
    num_sequences = lengths.shape[0]
    row_bytes = batch.shape[1] * itemsize
    file_bytes = tokens.shape[0] * itemsize
    for r in range(ids.shape[0]):
        i = ids[r]
        if i < 0:
            i += num_samples
        if i < 0 or i >= num_samples:
            return r
        j = shuffle[i]
        if j < 0 or j >= num_rows - 1:  # (not j + 1: it could wrap)
            return -2 - r
        first, begin = sample_index[j, 0], sample_index[j, 1]
        last, last_end = sample_index[j + 1, 0], sample_index[j + 1, 1] + extra
        if first < 0 or first > last or last >= num_positions:
            return -2 - r
        row = rows[r] if rows.shape[0] else r
        if row < 0 or row >= batch.shape[0]:
            return -2 - r
        at = row * row_bytes
        row_end = at + row_bytes
        for k in range(first, last + 1):
            document = document_index[k]
            if document < 0 or document >= num_sequences:
                return -2 - r
            end = last_end if k == last else lengths[document]
            size = (end - begin) * itemsize
            start = pointers[document] + begin * itemsize
            if (begin < 0 or size < 0 or end > lengths[document] or at + size > row_end
                    or start < 0 or start + size > file_bytes):
                return -2 - r
            _copy_bytes(batch, at, tokens, start, size)
            at += size
            begin = 0
        if at != row_end:
            return -2 - r
    return -1
