"""``numba.njit`` that keeps its machine code on disk where it can, for the compiled loops.

With ``cache=True`` numba stores each compiled loop next to its source (``__pycache__``) or,
where that is read-only, in the user's cache folder, so only a machine's first use compiles
(compile times: ``docs/perf/dataprep-index-kernels.md``). Where neither folder can be
written (a read-only image whose home is read-only too, as some containers run), numba
refuses ``cache=True`` when the function is decorated, so importing the kernels would fail
and with it every large index or blend build. There the loops are compiled in memory
instead, once per process, and a warning says how to give numba a folder.
"""

from __future__ import annotations

import warnings

import numba

_warned = False  # once per process, not once per loop


def njit(**flags):
    """``numba.njit(cache=True, **flags)``, or without the cache where numba has no folder."""

    def decorate(function):
        try:
            return numba.njit(cache=True, **flags)(function)
        except RuntimeError as error:
            if "no locator available" not in str(error):
                raise
            global _warned
            if not _warned:
                _warned = True
                warnings.warn("numba has no writable folder to cache bloomline's compiled loops "
                              "in (neither __pycache__ nor the user cache): they are compiled "
                              "in every process; set NUMBA_CACHE_DIR to a writable folder to "
                              "keep them", stacklevel=2)
            return numba.njit(**flags)(function)

    return decorate
