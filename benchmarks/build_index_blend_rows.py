"""The blend-indices children of ``benchmarks.build_index``: ``build_blend_indices`` against
megatron-core's ``helpers.build_blending_indices`` per dataset count, ours forced to the kernel
it did not choose, the write limit, and the first call of a fresh process.

Contract: ``child_blend_rows(cfg)`` and ``child_blend_first(cfg)`` take and return JSON-able
dicts; every array is compared across the three (``identical``).
"""

from __future__ import annotations

import os
import time
import warnings

import numpy as np

from benchmarks.harness.machine import cpu_busy_seconds

# ------------------------------------------------------------ blend indices alone (rows)

BLEND_DATASETS = "3,10,30,100,500"


def _blend_weights(num_datasets: int) -> np.ndarray:
    """Weights in proportion to dataset sizes spread like real corpora (lognormal, sigma 1,
    seeded by the count), normalized as megatron-core does."""
    weights = np.random.default_rng(num_datasets).lognormal(0.0, 1.0, num_datasets)
    return weights / weights.sum()


def child_blend_rows(cfg: dict) -> dict:
    """``build_blend_indices`` against megatron-core's ``helpers.build_blending_indices``
    (into ``numpy.zeros`` arrays, as its BlendedDataset allocates them) for each dataset
    count, the order alternating per round; both already loaded (first calls: blend_first)."""
    # in the child only: numba's import and kernel load are timed apart (blend_first)
    from bloomline.dataprep.blending import _greedy, blend_kernel, build_blend_indices

    helpers = None
    if cfg["with_mcore"]:
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers_cpp as helpers
    samples = cfg["samples"]
    floor = []  # the least any builder does: allocate both outputs and write them once
    for _ in range(cfg["repeats"]):
        wall = time.perf_counter()
        np.empty(samples, dtype=np.int16).fill(1)
        np.empty(samples, dtype=np.int64).fill(1)
        floor.append(time.perf_counter() - wall)
    rows = []
    for num in cfg["datasets"]:
        weights = _blend_weights(num)
        build_blend_indices(weights, 1000)  # JIT load, not timed here
        groups = len(np.unique(weights))
        kernel = blend_kernel(weights)
        # the kernel not chosen, timed too: the evidence for the choice
        unchosen = "wake" if kernel == "segments" else "segments"
        _greedy(weights, 1000, None, unchosen)
        runs: dict[str, dict[str, list]] = {
            b: {"wall": [], "cpu": [], "other": []} for b in ("ours", "megatron", "unchosen")}
        identical = True
        for round_no in range(cfg["repeats"]):
            order = ["ours", "unchosen"] + (["megatron"] if helpers is not None else [])
            out = {}
            for builder in order if round_no % 2 == 0 else order[::-1]:
                wall, cpu, busy = time.perf_counter(), time.process_time(), cpu_busy_seconds()
                if builder == "ours":
                    out[builder] = build_blend_indices(weights, samples)
                elif builder == "unchosen":
                    out[builder] = _greedy(weights, samples, None, unchosen)
                else:
                    index = np.zeros(samples, dtype=np.int16)
                    sample = np.zeros(samples, dtype=np.int64)
                    helpers.build_blending_indices(index, sample, weights, num, samples, False)
                    out[builder] = (index, sample)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                other = max(cpu_busy_seconds() - busy - cpu, 0.0) / wall
                for key, value in (("wall", wall), ("cpu", cpu), ("other", other)):
                    runs[builder][key].append(value)
            identical &= all(np.array_equal(a, b) and a.dtype == b.dtype
                             for other in order[1:]
                             for a, b in zip(out["ours"], out[other], strict=True))
            del out
        rows.append({"datasets": num, "kernel": kernel, "unchosen": unchosen, "groups": groups,
                     "runs": runs, "identical": identical})
        print(f"{num} datasets done", flush=True)
    return {"rows": rows, "write_floor": floor}


def child_blend_first(cfg: dict) -> dict:
    """The first blend of a fresh process, as a user's first ``build-index`` meets it:
    ours (numba's import, then each kernel compiled, or loaded from numba's cache) and
    megatron-core's (the import of its compiled helpers, then the call)."""
    # numba's cache in a folder of the bench's own: empty for the first run (a compile), as
    # the first run left it for the second (a cache load); read when numba is imported
    os.environ["NUMBA_CACHE_DIR"] = cfg["numba_cache"]
    from bloomline.dataprep.blending import build_blend_indices

    out = {}
    start = time.perf_counter()
    build_blend_indices(_blend_weights(3), 1000)
    out["ours_segments"] = time.perf_counter() - start
    start = time.perf_counter()
    build_blend_indices(_blend_weights(500), 1000)
    out["ours_wake"] = time.perf_counter() - start
    if cfg["with_mcore"]:
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        from megatron.core.datasets import helpers_cpp

        index, sample = np.zeros(1000, dtype=np.int16), np.zeros(1000, dtype=np.int64)
        helpers_cpp.build_blending_indices(index, sample, _blend_weights(3), 3, 1000, False)
        out["megatron"] = time.perf_counter() - start
    return out
