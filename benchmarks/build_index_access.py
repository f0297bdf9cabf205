"""The access child of ``benchmarks.build_index``: random ``ds[i]`` on the single dataset's
train split (ours, megatron-core's two paths, the plain-copy limit) and the batched reads
(``get_batch`` in micro-batches against ``ds[i]`` one by one and the limit), on the single
dataset and a blend of three.

Contract: ``child_access(cfg) -> dict`` of rates (samples/s), the page-cache warm-up, the
check that our samples equal megatron-core's and, when ``batch_samples``, the batched rows.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.build_index_builds import _import_megatron, _megatron_datasets
from benchmarks.harness.machine import cpu_busy_seconds
from benchmarks.harness.stats import median, ratio
from benchmarks.harness.token_corpus import SEED, SEQ_LENGTH, SINGLE, WEIGHTS


def child_access(cfg: dict) -> dict:
    """ds[i] per second on the single dataset's train split (both caches already built)."""
    # in the child only: what it loads is part of what the child measures, not the parent's
    from bloomline.dataprep import IndexRequest, build_sample_datasets

    corpus = Path(cfg["corpus"])
    bin_path = corpus / f"{SINGLE}.bin"
    start = time.perf_counter()
    with open(bin_path, "rb", buffering=0) as fh:  # warm the page cache
        buffer = bytearray(64 << 20)
        nbytes = 0
        while n := fh.readinto(buffer):
            nbytes += n
    warm = {"bytes": nbytes, "seconds": time.perf_counter() - start}
    del buffer

    request = IndexRequest(seq_length=SEQ_LENGTH, train_samples=cfg["samples"],
                           valid_samples=None, test_samples=None, split="1,0,0", seed=SEED)
    built = build_sample_datasets(corpus, request, cache_dir=cfg["ours_cache"])
    ours = built.splits["train"]
    idx = np.random.default_rng(42).integers(0, len(ours), size=cfg["access_samples"])
    picks = idx.tolist()
    results: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        for i in picks:
            fn(i)
        results[name] = len(picks) / (time.perf_counter() - start)

    timed("ours", ours.__getitem__)

    # the limit: L + 1 tokens copied from where each sample starts, through a fresh mapping
    index = ours.index
    rows = np.asarray(index.sample_index[np.asarray(index.shuffle_index[idx], dtype=np.int64)])
    docs = np.asarray(index.document_index[rows[:, 0]], dtype=np.int64)
    dataset = ours.dataset
    starts = (np.asarray(dataset.sequence_pointers[docs]) // 2) + rows[:, 1]
    total_tokens = dataset.bin_path.stat().st_size // 2
    starts = np.minimum(starts, total_tokens - (SEQ_LENGTH + 1)).tolist()
    tokens = np.memmap(bin_path, np.uint16, "r").view(np.ndarray)
    buf = np.empty(SEQ_LENGTH + 1, dtype=np.int64)
    width = SEQ_LENGTH + 1
    start = time.perf_counter()
    for s in starts:
        buf[:] = tokens[s : s + width]
    results["memcpy"] = len(starts) / (time.perf_counter() - start)

    checked = None
    if cfg["mcore_cache"]:
        theirs = _megatron_datasets({"corpus": cfg["corpus"], "cache": cfg["mcore_cache"],
                                     "samples": cfg["samples"], "weights": None},
                                    _import_megatron())()[0]
        if len(theirs) != len(ours):
            raise SystemExit(f"access: megatron has {len(theirs)} samples, ours {len(ours)}")
        timed("mcore_query", theirs._query_document_sample_shuffle_indices)
        timed("mcore_getitem", theirs.__getitem__)
        check = picks[:2000]
        checked = {"samples": len(check), "equal": all(
            np.array_equal(ours[i], theirs._query_document_sample_shuffle_indices(i)[0])
            for i in check)}
    batched = batched_reads(ours, cfg) if cfg.get("batch_samples") else None
    return {"rates": results, "warm": warm, "samples": len(picks), "checked": checked,
            "dataset_samples": len(ours), "batched": batched}


# ------------------------------------------------------------ batched reads (get_batch)

BATCH_SIZES = "1,8,32,128"


def _copy_starts(component, own: np.ndarray) -> np.ndarray:
    """Where samples ``own`` of one dataset's split start in its ``.bin`` (token numbers),
    moved back where fewer than L + 1 tokens follow: the plain copy's source offsets."""
    index, dataset = component.index, component.dataset
    rows = np.asarray(index.sample_index[np.asarray(index.shuffle_index[own], dtype=np.int64)])
    docs = np.asarray(index.document_index[rows[:, 0]], dtype=np.int64)
    itemsize = dataset.dtype.itemsize
    starts = np.asarray(dataset.sequence_pointers[docs]) // itemsize + rows[:, 1]
    return np.minimum(starts, dataset.bin_path.stat().st_size // itemsize - (SEQ_LENGTH + 1))


def _window_copy(tokens: np.ndarray, starts: np.ndarray, size: int = 32):
    """The limit's copies without Python: a compiled loop copies each sample's L + 1 tokens
    from its start into a batch of ``size`` in the file's dtype (the memory's floor for one
    contiguous window per sample; get_batch copies several document runs per sample).
    Returns the timed function; compiled before it is returned, so not on the clock."""
    import numba  # the one contestant that needs it; the others run without

    @numba.njit(nogil=True, boundscheck=False)
    def copy_windows(tokens, starts, batch):
        for r in range(starts.shape[0]):
            batch[r, :] = tokens[starts[r] : starts[r] + batch.shape[1]]

    width = SEQ_LENGTH + 1
    groups = [starts[s : s + size] for s in range(0, len(starts), size)]
    batch = np.empty((size, width), dtype=tokens.dtype)
    copy_windows(tokens, groups[0][:1], batch[:1])  # compile before the clock

    def run():
        for group_starts in groups:
            copy_windows(tokens, group_starts, batch[: len(group_starts)])
    return run


def _batched_case(ds, ids: np.ndarray, sizes: list[int], rounds: int) -> dict:
    """Samples/s of ``ds[i]`` one by one, ``ds.get_batch`` in micro-batches of each size
    (lists of ids, as the loader's sampler hands them over) and the plain-copy limit, every
    contestant once per round after one untimed round (so every mapping's page tables are
    filled: steady state, as in a long run), the order reversed every other round."""
    components = getattr(ds, "datasets", [ds])
    if hasattr(ds, "datasets"):
        which = np.asarray(ds.dataset_index[ids], dtype=np.int64)
        own = np.asarray(ds.dataset_sample_index[ids], dtype=np.int64)
    else:
        which, own = np.zeros(len(ids), dtype=np.int64), ids
    starts = np.empty(len(ids), dtype=np.int64)
    for number, component in enumerate(components):
        mine = which == number
        starts[mine] = _copy_starts(component, own[mine])
    maps = [np.memmap(c.dataset.bin_path, c.dataset.dtype, "r").view(np.ndarray)
            for c in components]
    sources = [maps[k] for k in which.tolist()]  # each sample's token file
    starts_list, picks = starts.tolist(), ids.tolist()
    width = SEQ_LENGTH + 1

    def limit():
        buf = np.empty(width, dtype=np.int64)
        for tokens, s in zip(sources, starts_list, strict=True):
            buf[:] = tokens[s : s + width]

    def one_by_one():
        for i in picks:
            ds[i]

    def batched(size):
        batches = [picks[s : s + size] for s in range(0, len(picks), size)]

        def run():
            for batch in batches:
                ds.get_batch(batch)
        return run

    contestants = {"limit": limit, "ds[i]": one_by_one}
    contestants.update({f"get_batch {size}": batched(size) for size in sizes})
    if len(components) == 1:
        contestants["window copy 32, compiled"] = _window_copy(maps[0], starts)
    check = picks[:2048]
    equal = all(np.array_equal(ds.get_batch(check[s : s + 32]),
                               np.stack([ds[i] for i in check[s : s + 32]]))
                for s in range(0, len(check), 32))
    runs = {name: {"wall": [], "cpu": [], "other": []} for name in contestants}
    for round_no in range(rounds + 1):
        names = list(contestants) if round_no % 2 else list(contestants)[::-1]
        for name in names:
            wall, cpu, busy = time.perf_counter(), time.process_time(), cpu_busy_seconds()
            contestants[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            other = max(cpu_busy_seconds() - busy - cpu, 0.0) / wall
            if round_no:  # round 0 fills the page tables
                for key, value in (("wall", wall), ("cpu", cpu), ("other", other)):
                    runs[name][key].append(value)
    runs_per_sample = None  # document runs a sample spans (the pieces get_batch copies)
    if len(components) == 1:
        built = np.asarray(ds.index.shuffle_index[ids], dtype=np.int64)
        positions = np.asarray(ds.index.sample_index[:, 0])
        runs_per_sample = float(np.mean(positions[built + 1] - positions[built] + 1))
    return {"samples": len(ids), "dataset_samples": len(ds), "datasets": len(components),
            "equal": equal, "runs": runs, "runs_per_sample": runs_per_sample}


def batched_reads(single, cfg: dict) -> dict:
    """The batched-read rows: the single dataset's train split, and a blend of the blend
    corpus's three datasets (weights as the blend build's, ``--batch-blend-samples``
    samples, built into a folder of the single case's cache, which main() deletes)."""
    # in the child only: what it loads is part of what the child measures, not the parent's
    from bloomline.dataprep import IndexRequest, build_sample_datasets

    sizes = [int(v) for v in cfg["batch_sizes"].split(",")]
    count = cfg["batch_samples"]
    out = {"sizes": sizes, "rounds": cfg["batch_rounds"]}
    ids = np.random.default_rng(7).integers(0, len(single), size=count)
    out["single"] = _batched_case(single, ids, sizes, cfg["batch_rounds"])
    if cfg.get("blend_corpus"):
        request = IndexRequest(seq_length=SEQ_LENGTH, train_samples=cfg["batch_blend_samples"],
                               valid_samples=None, test_samples=None, split="1,0,0",
                               seed=SEED, weights=WEIGHTS)
        blend = build_sample_datasets(cfg["blend_corpus"], request, cache_dir=Path(
            cfg["ours_cache"]) / "batched-blend").splits["train"]
        ids = np.random.default_rng(8).integers(0, len(blend), size=count)
        out["blend"] = _batched_case(blend, ids, sizes, cfg["batch_rounds"])
    return out


def report_batched(accesses: list[dict]) -> bool:
    """The batched-read table (medians over every round of every access child); True when
    get_batch reaches half the plain-copy limit at the largest micro-batch in both cases."""
    results = [a["batched"] for a in accesses if a.get("batched")]
    if not results:
        return True
    sizes = results[0]["sizes"]
    header = (f"{'batched reads (L=' + str(SEQ_LENGTH) + ')':<30} {'samples/s':>10} "
              f"{'% of limit':>10} {'(cpu)':>6} {'other cores':>11}")
    print()
    print(header)
    print("-" * len(header))
    reached, targets = True, []
    for case in ("single", "blend"):
        cases = [r[case] for r in results if case in r]
        if not cases:
            continue
        names = (["limit", "ds[i]"] + [f"get_batch {size}" for size in sizes]
                 + [n for n in ["window copy 32, compiled"] if n in cases[0]["runs"]])

        def joined(name, key, cases=cases):
            return [v for c in cases for v in c["runs"][name][key]]

        limit_wall, limit_cpu = joined("limit", "wall"), joined("limit", "cpu")
        for name in names:
            wall, cpu = joined(name, "wall"), joined(name, "cpu")
            rate = cases[0]["samples"] / median(wall)
            pct = ratio(limit_wall, wall) * 100  # rate / limit rate = limit s / our s
            pct_cpu = ratio(limit_cpu, cpu) * 100
            label = f"{case}: {name}"
            print(f"{label:<30} {rate:>10,.0f} {pct:>9.0f}% {pct_cpu:>5.0f}% "
                  f"{median(joined(name, 'other')):>11.2f}")
        half = [size for size in sizes
                if ratio(limit_wall, joined(f"get_batch {size}", "wall")) >= 0.5]
        reached &= sizes[-1] in half
        targets.append(f"{case} {', '.join(map(str, half)) or 'none'}")
        first = cases[0]
        spans = (f", {first['runs_per_sample']:.1f} document runs per sample"
                 if first["runs_per_sample"] else "")
        print(f"  {case}: {first['samples']:,} random samples of {first['dataset_samples']:,}"
              f" ({first['datasets']} dataset{'s' if first['datasets'] > 1 else ''}{spans}); "
              f"get_batch equal to stacked ds[i]: "
              f"{'yes' if all(c['equal'] for c in cases) else 'NO'}")
    rounds = sum(len(r["single"]["runs"]["limit"]["wall"]) for r in results)
    print(f"medians over {rounds} rounds, each after an untimed round (steady state: every "
          "mapping's page tables filled), the order reversed every other round. % of limit: "
          "the median of per-round ratios to the plain copy of L + 1 tokens from each "
          "sample's start into an int64 buffer (one Python-level copy per sample, no index "
          "lookups); (cpu): the same ratio in this process's CPU seconds; other cores: cores "
          "other processes kept busy meanwhile. get_batch N: micro-batches of N ids as lists, "
          "tokens in the file's dtype (uint16). window copy 32, compiled: the limit's copies "
          "by a compiled loop into batches of 32 in the file's dtype, the memory's floor for "
          "one contiguous window per sample (a sample spans several document runs).")
    print(f"target: get_batch at >= 50% of the plain-copy limit (wall): reached at "
          f"micro-batches of {'; '.join(targets)}: {'PASS' if reached else 'FAIL'} at "
          f"{sizes[-1]}")
    return reached
