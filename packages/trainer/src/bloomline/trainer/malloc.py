"""Host (CPU-side) settings that change training speed, applied once per process.

glibc's malloc serves every allocation above its mmap threshold (128 KiB, adapting upward to
at most 32 MiB) with a fresh ``mmap`` and returns it with ``munmap`` on free. A training step
allocates and frees the same large activations, logits and gradients every step, so each step
pays the page faults of first touch again (measurements: docs/perf/cpu-kernels.md).
Raising the threshold keeps such blocks in the heap for reuse, the effect jemalloc
or tcmalloc give when preloaded (PyTorch's CPU performance guide recommends those; this needs
no extra library). The cost: freed heap memory is kept by the process instead of returned.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["tune_malloc"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
_THRESHOLD = 1 << 30


@functools.cache
def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB; True when it took effect (Linux glibc
    only). The trim threshold matters as much: left at 128 KiB, free memory at the top of
    the heap goes back to the OS at every free and faults in again on the next step."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) == 1
            and mallopt(_M_TRIM_THRESHOLD, _THRESHOLD) == 1)
