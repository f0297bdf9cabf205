"""The compiled loops where numba has no folder to cache them in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import warnings
import numpy as np
from bloomline.dataprep import blending, gpt_index

warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    index, sample = blending.build_blend_indices(np.array([0.2, 0.3, 0.5]), 6)
    gpt_index._COMPILED_FROM = 2  # the compiled shuffle, however short the array
    ours, theirs = np.arange(1000), np.arange(1000)
    gpt_index.shuffle(np.random.RandomState(7), ours)
    np.random.RandomState(7).shuffle(theirs)
assert index.tolist() == [2, 1, 0, 2, 1, 2] and sample.tolist() == [0, 0, 0, 1, 1, 2]
assert np.array_equal(ours, theirs)
print(len([w for w in caught if "NUMBA_CACHE_DIR" in str(w.message)]))
"""


def test_kernels_work_where_numba_cannot_cache():
    """Catches: importing the compiled loops failing (numba's "cannot cache function: no
    locator available") where neither __pycache__ nor the user's cache folder is writable,
    as in a read-only container: every blend and large index build would fail. numba is
    made to find no cache folder (only its IPython locator, which declines a .py file);
    the kernels must still give the rule's results, with one warning naming the remedy."""
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="IPythonCacheLocator")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1"]
