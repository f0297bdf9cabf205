"""Sample-index builds (time, peak memory) and random access against megatron-core's builder.

On a generated corpus of ~1B uint16 tokens in ~2M documents (lognormal lengths, mean ~500
tokens; written once under ``--cache-dir`` and reused) at L = 2048 it measures:

  (a) single: one 1B-token dataset, train split only, ``--epochs`` (10) epochs' worth of
      samples: ``build_sample_datasets`` against megatron-core's ``BlendedMegatronDatasetBuilder``
      (``GPTDataset``, one prefix, no weights);
  (b) blend: three datasets of ~1/3 of the tokens each, weights 0.5/0.3/0.2, a train blend of
      ``--blend-samples`` (100M) samples: both builders, each building the three GPT indices
      (with megatron's 0.5% surplus) and the blend indices;
  (c) random access ``ds[i]`` on the single dataset's train split for ``--access-samples``
      random i (the same i for all): ours, megatron's ``GPTDataset.__getitem__`` (a dict of
      torch tensors) and its numpy-level ``_query_document_sample_shuffle_indices``, and a
      plain copy of L + 1 tokens from the same start offsets of the memory-mapped ``.bin`` into
      a preallocated int64 buffer (the limit). The page cache is warmed first (the ``.bin`` is
      read once), so this measures memory, not disk.
  (d) batched reads, in the same child: ``ds.get_batch`` in micro-batches of
      ``--batch-sizes`` (1, 8, 32, 128) ids against ``ds[i]`` one by one and the same plain-copy
      limit, for ``--batch-samples`` random samples of the single dataset's train split and of
      a blend of the three (``--batch-blend-samples``, 1M): ``--batch-rounds`` (3) rounds after
      an untimed one, wall and CPU seconds, the cores other processes kept busy meanwhile;
      and the limit's copies by a compiled loop (the memory's floor for one window a sample).

Every build runs in a fresh child process (this script with ``--child``) into a fresh, empty
cache folder, so it is a build, not a cache hit, and the peak RSS is that build's alone: peak
memory is ``ru_maxrss`` after the build minus the RSS just before it (the RSS after imports,
torch included for megatron-core, is printed too); seconds are wall time around the build call
only. The floor of a build is what both builders must do in the order the RNG fixes: the
shuffles of the document and shuffle indices, timed alone for the same sizes (and their peak
memory: the shuffled arrays themselves), ours (compiled) and numpy's ``RandomState.shuffle``
(megatron-core's), which give the same permutations. A child then compares our
``.npy`` indices with megatron's (document/sample/shuffle per dataset, dataset_index and
dataset_sample_index of the blend) and prints ``identical: yes/no``.

``--repeats`` rounds (default 2) run every measurement in turn, ours and megatron-core's
alternating which goes first; each ratio is taken within a round and the median over rounds
reported, because this machine's speed drifts from one minute to the next.

Run: ``make bench-build-index`` or ``.venv/bin/python benchmarks/bench_build_index.py
[--quick] [--skip-megatron]``. The full run needs ~4 GB of disk for the corpus, ~8 GB more
while the blend caches exist (deleted after each round), and several GB of memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from machine import cpu_busy_seconds, header_line, load_average, relative

SEQ_LENGTH = 2048
SEED = 1234
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
SINGLE = "all"
VOCAB = 65000  # < 65500: uint16 tokens, as Megatron stores them
MEAN_DOC = 500.0
SIGMA_DOC = 1.0  # lognormal sigma: median ~300 tokens, a tail to tens of thousands
BATCH_DOCS = 50_000
CHUNK = 1 << 25  # elements per comparison chunk


# ----------------------------------------------------------------------------- helpers


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def hwm_bytes() -> int:
    """VmHWM: the peak RSS of this process image alone (a cross-check of ru_maxrss, which can
    inherit the parent's peak across fork/exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.npy"))


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Tokenizer:
    """What GPTDatasetConfig needs of a tokenizer."""

    eod, pad, vocab_size = 0, 1, VOCAB
    unique_identifiers = {"name": "bench_build_index"}


def _import_megatron():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" etc.
    import torch  # noqa: F401
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


def _megatron_datasets(cfg: dict, modules) -> list:
    """megatron-core's train split for cfg's corpus: built, or loaded when cached."""
    import torch

    builder_cls, gpt_cls, config_cls = modules
    if not torch.distributed.is_initialized():
        # BlendedDataset asks torch.distributed for the rank: a one-rank gloo group
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    weights = cfg["weights"]
    prefixes = [str(Path(cfg["corpus"]) / name) for name in (weights or [SINGLE])]
    config = config_cls(
        random_seed=SEED, sequence_length=SEQ_LENGTH, split="1,0,0",
        blend=(prefixes, list(weights.values()) if weights else None),
        path_to_cache=cfg["cache"], tokenizer=_Tokenizer(), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False)
    # weights need sizes for every split (0: none); one prefix without weights takes None
    sizes = [cfg["samples"], 0, 0] if weights else [cfg["samples"], None, None]

    def build():
        return builder_cls(gpt_cls, sizes, lambda: True, config).build()
    return build


# ------------------------------------------------------------------------ child kinds


def child_ours(cfg: dict) -> dict:
    from bloomline.dataprep import IndexRequest, build_sample_datasets

    weights = cfg["weights"]
    request = IndexRequest(seq_length=SEQ_LENGTH, train_samples=cfg["samples"],
                           valid_samples=None, test_samples=None, split="1,0,0", seed=SEED,
                           weights=weights)
    before, maxrss_before = rss_bytes(), maxrss_bytes()
    start = time.perf_counter()
    built = build_sample_datasets(cfg["corpus"], request, cache_dir=cfg["cache"])
    seconds = time.perf_counter() - start
    peak, hwm = maxrss_bytes(), hwm_bytes()
    train = built.report["splits"]["train"]
    statuses = [row["status"] for row in train["datasets"].values()]
    if "blend" in train:
        statuses.append(train["blend"]["status"])
    if any(s != "built" for s in statuses):
        raise SystemExit(f"ours: expected a build, got cache statuses {statuses}")
    datasets = {name: {key: row[key] for key in ("documents", "tokens", "epochs", "samples",
                                                   "requested", "separate_last_epoch")}
                for name, row in train["datasets"].items()}
    return {"seconds": seconds, "rss_before": before, "maxrss_before": maxrss_before,
            "peak": peak, "hwm": hwm, "samples": len(built.splits["train"]),
            "datasets": datasets, "index_bytes": dir_bytes(Path(cfg["cache"]))}


def child_megatron(cfg: dict) -> dict:
    build = _megatron_datasets(cfg, _import_megatron())
    before, maxrss_before = rss_bytes(), maxrss_bytes()
    start = time.perf_counter()
    train = build()[0]
    seconds = time.perf_counter() - start
    peak, hwm = maxrss_bytes(), hwm_bytes()
    parts = getattr(train, "datasets", [train])
    return {"seconds": seconds, "rss_before": before, "maxrss_before": maxrss_before,
            "peak": peak, "hwm": hwm, "samples": len(train),
            "datasets": {Path(p.dataset_path).name: {"samples": len(p)} for p in parts},
            "index_bytes": dir_bytes(Path(cfg["cache"]))}


def child_floor(cfg: dict) -> dict:
    """The shuffles both builders make, in the same sizes and dtypes and the RNG's order,
    timed alone: numpy's ``RandomState.shuffle`` (megatron-core's) and ours (compiled, the
    same permutation; its numba import and kernel load timed apart first); one component at
    a time (each builder also finishes one before the next)."""
    from bloomline.dataprep import gpt_samples

    start = time.perf_counter()
    for dtype in (np.int32, np.uint32):  # import numba, load both kernels from its cache
        gpt_samples.shuffle(np.random.RandomState(0),
                            np.arange(gpt_samples._COMPILED_FROM, dtype=dtype))
    out, rss_before = {"compiled_load": time.perf_counter() - start}, rss_bytes()
    for case, components in cfg["cases"].items():  # single first: its peak is the smaller
        seconds = {"numpy": 0.0, "ours": 0.0}
        for comp in components:
            for way, shuffle in (("numpy", lambda rng, a: rng.shuffle(a)),
                                 ("ours", gpt_samples.shuffle)):
                rng = np.random.RandomState(SEED)
                ids = np.arange(comp["documents"], dtype=np.int32)
                epochs = comp["epochs"]
                doc_parts = [epochs - 1, 1] if comp["separate"] and epochs > 1 else [epochs]
                arrays = []
                for part in doc_parts:
                    array = np.tile(ids, part)
                    start = time.perf_counter()
                    shuffle(rng, array)
                    seconds[way] += time.perf_counter() - start
                    arrays.append(array)
                bounds = [0, comp["first_shuffle"], comp["built"]]
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                    if hi > lo:
                        array = np.arange(lo, hi, dtype=np.uint32)
                        start = time.perf_counter()
                        shuffle(rng, array)
                        seconds[way] += time.perf_counter() - start
                        arrays.append(array)
                del arrays
        out[case] = {"seconds": seconds["ours"], "numpy_seconds": seconds["numpy"],
                     "peak_above": maxrss_bytes() - rss_before}
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return all(np.array_equal(a[s : s + CHUNK], b[s : s + CHUNK])
               for s in range(0, len(a), CHUNK))


def child_compare(cfg: dict) -> dict:
    """Our cache's .npy arrays against megatron-core's, array by array."""
    ours_dir, mcore_dir = Path(cfg["ours_cache"]), Path(cfg["mcore_cache"])
    ours: dict[tuple[str, str], Path] = {}
    for entry in ours_dir.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        parts = entry.name.split("-")  # gpt-train-NAME-KEY or blend-train-KEY
        owner = "blend" if parts[0] == "blend" else "-".join(parts[2:-1])
        for npy in entry.glob("*.npy"):
            ours[(owner, npy.stem)] = npy
    theirs: dict[tuple[str, str], Path] = {}
    for desc in mcore_dir.glob("*-description.txt"):
        base = desc.name[: -len("description.txt")]
        if "-BlendedDataset-" in desc.name:
            owner = "blend"
        else:
            owner = Path(json.loads(desc.read_text())["dataset_path"]).name
        for npy in mcore_dir.glob(f"{base}*.npy"):
            theirs[(owner, npy.name[len(base) : -len(".npy")])] = npy
    rows, identical = [], set(ours) == set(theirs) and bool(ours)
    for key in sorted(set(ours) | set(theirs)):
        if key not in ours or key not in theirs:
            rows.append({"array": "/".join(key), "equal": False,
                         "note": "only in " + ("ours" if key in ours else "megatron-core")})
            continue
        a = np.load(ours[key], mmap_mode="r")
        b = np.load(theirs[key], mmap_mode="r", allow_pickle=True)
        equal = _same(a, b)
        identical &= equal
        rows.append({"array": "/".join(key), "equal": equal, "shape": list(a.shape),
                     "dtypes": [str(a.dtype), str(b.dtype)]})
    return {"identical": identical, "rows": rows}


def child_access(cfg: dict) -> dict:
    """ds[i] per second on the single dataset's train split (both caches already built)."""
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

    def window_copy(size=32):
        """The limit's copies without Python: a compiled loop copies each sample's L + 1
        tokens from its start into a batch of ``size`` in the file's dtype (the memory's
        floor for one contiguous window per sample; get_batch copies ~5 runs per sample)."""
        import numba

        @numba.njit(nogil=True, boundscheck=False)
        def copy_windows(tokens, starts, batch):
            for r in range(starts.shape[0]):
                batch[r, :] = tokens[starts[r] : starts[r] + batch.shape[1]]

        groups = [(maps[0], starts[s : s + size]) for s in range(0, len(ids), size)]
        batch = np.empty((size, width), dtype=maps[0].dtype)
        copy_windows(groups[0][0], groups[0][1][:1], batch[:1])  # compile before the clock

        def run():
            for tokens, group_starts in groups:
                copy_windows(tokens, group_starts, batch[: len(group_starts)])
        return run

    contestants = {"limit": limit, "ds[i]": one_by_one}
    contestants.update({f"get_batch {size}": batched(size) for size in sizes})
    if len(components) == 1:
        contestants["window copy 32, compiled"] = window_copy()
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


CHILDREN = {"generate": child_generate, "ours": child_ours, "megatron": child_megatron,
            "floor": child_floor, "compare": child_compare, "access": child_access,
            "blend_rows": child_blend_rows, "blend_first": child_blend_first}


def run_child(kind: str, cfg: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind,
           "--child-config", json.dumps(cfg)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        else:
            print(f"  [{kind}] {line}", flush=True)
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"child {kind} failed (exit {proc.returncode})")
    return result


# ------------------------------------------------------------------------------- parent


def floor_components(ours_result: dict) -> list[dict]:
    """Shuffle sizes of each of our GPT indices, from the build's report."""
    comps = []
    for row in ours_result["datasets"].values():
        epochs, tokens = row["epochs"], row["tokens"]
        first = row["samples"]
        if row["separate_last_epoch"]:
            first = ((epochs - 1) * tokens - 1) // SEQ_LENGTH
        comps.append({"documents": row["documents"], "epochs": epochs,
                      "separate": row["separate_last_epoch"], "first_shuffle": first,
                      "built": row["samples"]})
    return comps


def median(values):
    return float(np.median(values)) if values else None


def ratio(numerators, denominators):
    """The median of per-round ratios (rounds minutes apart at most share the machine's
    speed)."""
    pairs = [(a, b) for a, b in zip(numerators, denominators, strict=True) if b]
    return float(np.median([a / b for a, b in pairs])) if pairs else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--docs", type=float, default=2e6)
    parser.add_argument("--blend-samples", type=float, default=1e8)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--access-samples", type=int, default=200_000)
    parser.add_argument("--batch-samples", type=int, default=100_000,
                        help="batched reads: random samples per contestant and round (0: skip)")
    parser.add_argument("--batch-sizes", default=BATCH_SIZES,
                        help="batched reads: comma-separated micro-batch sizes")
    parser.add_argument("--batch-rounds", type=int, default=3,
                        help="batched reads: timed rounds per access run, medians reported")
    parser.add_argument("--batch-blend-samples", type=int, default=1_000_000,
                        help="batched reads: samples of the blend they read from")
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--skip-megatron", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="1e7 tokens, 2e4 documents, 1e6 blend samples, 20k accesses")
    parser.add_argument("--cache-dir", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--blend-rows-samples", type=float, default=1e7,
                        help="blend indices alone: samples per blend (--quick: 1e6)")
    parser.add_argument("--blend-rows-datasets", default=BLEND_DATASETS,
                        help="blend indices alone: comma-separated dataset counts")
    parser.add_argument("--blend-rows-repeats", type=int, default=5,
                        help="blend indices alone: rounds, medians reported")
    parser.add_argument("--blend-rows-only", action="store_true",
                        help="only the blend-indices rows (no corpus, a few minutes)")
    parser.add_argument("--skip-blend-rows", action="store_true")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = CHILDREN[args.child](json.loads(args.child_config))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    versions = []
    if importlib.util.find_spec("megatron") is not None:
        from importlib.metadata import PackageNotFoundError, version
        try:
            versions.append(f"megatron-core {version('megatron-core')}")
        except PackageNotFoundError:
            pass
    print(header_line(*versions), flush=True)
    print(load_average("before"), flush=True)
    if args.quick:
        args.tokens, args.docs, args.blend_samples = 1e7, 2e4, 1e6
        args.access_samples = min(args.access_samples, 20_000)
        args.batch_samples = min(args.batch_samples, 20_000)

    with_mcore = not args.skip_megatron and importlib.util.find_spec("megatron") is not None \
        and importlib.util.find_spec("megatron.core") is not None
    if args.blend_rows_only:
        return report_blend_rows(args, with_mcore)
    root = args.cache_dir / f"build_index_{args.tokens:g}t_{args.docs:g}d"
    root.mkdir(parents=True, exist_ok=True)
    stats = run_child("generate", {"root": str(root), "tokens": int(args.tokens),
                                   "docs": int(args.docs)})
    single_tokens = stats[f"single/{SINGLE}"]["tokens"]
    single_samples = args.epochs * ((single_tokens - 1) // SEQ_LENGTH)
    blend_samples = int(args.blend_samples)
    runs = root / "runs"
    shutil.rmtree(runs, ignore_errors=True)  # leftovers of an interrupted run

    cases = {"single": {"corpus": str(root / "single"), "samples": single_samples,
                        "weights": None},
             "blend": {"corpus": str(root / "blend"), "samples": blend_samples,
                       "weights": WEIGHTS}}
    res: dict[str, dict[str, list]] = {c: {"ours": [], "megatron": []} for c in cases}
    floors, accesses, compares = [], [], {c: [] for c in cases}
    builders = ["ours", "megatron"] if with_mcore else ["ours"]
    try:
        for round_no in range(1, args.repeats + 1):
            order = builders if round_no % 2 else builders[::-1]
            for case, cfg in cases.items():
                caches = {b: fresh_dir(runs / f"{case}-{b}") for b in builders}
                for builder in order:
                    print(f"round {round_no}/{args.repeats}: {case} build, {builder} ...",
                          flush=True)
                    res[case][builder].append(
                        run_child(builder, {**cfg, "cache": str(caches[builder])}))
                if with_mcore:
                    print(f"round {round_no}/{args.repeats}: {case}: comparing indices ...",
                          flush=True)
                    compares[case].append(run_child("compare", {
                        "ours_cache": str(caches["ours"]),
                        "mcore_cache": str(caches["megatron"])}))
                if case == "single":
                    print(f"round {round_no}/{args.repeats}: random access ...", flush=True)
                    accesses.append(run_child("access", {
                        "corpus": cfg["corpus"], "samples": single_samples,
                        "ours_cache": str(caches["ours"]),
                        "mcore_cache": str(caches["megatron"]) if with_mcore else None,
                        "access_samples": args.access_samples,
                        "blend_corpus": cases["blend"]["corpus"],
                        "batch_samples": args.batch_samples, "batch_sizes": args.batch_sizes,
                        "batch_rounds": args.batch_rounds,
                        "batch_blend_samples": args.batch_blend_samples}))
                for path in caches.values():
                    shutil.rmtree(path, ignore_errors=True)
            print(f"round {round_no}/{args.repeats}: floor (the shuffles) ...",
                  flush=True)
            floors.append(run_child("floor", {"cases": {
                case: floor_components(res[case]["ours"][-1]) for case in cases}}))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    code = report(args, stats, cases, res, floors, accesses, compares, with_mcore)
    if not args.skip_blend_rows:
        code = max(code, report_blend_rows(args, with_mcore))
    return code


def report(args, stats, cases, res, floors, accesses, compares, with_mcore) -> int:
    mb = 1 / 2**20
    corpus = relative(args.cache_dir / f"build_index_{args.tokens:g}t_{args.docs:g}d")
    print(f"\ncorpus {corpus} "
          f"(uint16 tokens, lognormal document lengths, sigma {SIGMA_DOC}); "
          f"os.cpu_count() = {os.cpu_count()}")
    for name, s in stats.items():
        print(f"  {name:<10} {s['tokens']:>15,} tokens {s['documents']:>11,} documents  "
              f"mean {s['mean']:.0f}, median {s['median']:.0f}, max {s['max']:,} tokens; "
              f"{s['bin_bytes'] / 1e9:.2f} GB")
    for case in cases:
        ours = res[case]["ours"][0]
        label = (f"{args.epochs} epochs' worth" if case == "single" else
                 "weights " + ", ".join(f"{k}={v}" for k, v in WEIGHTS.items()))
        line = (f"{case}: L={SEQ_LENGTH}, seed {SEED}, {label}: {cases[case]['samples']:,} "
                f"samples requested, {ours['samples']:,} served; index files: ours "
                f"{ours['index_bytes'] * mb:,.0f} MiB")
        if with_mcore:
            line += f", megatron-core {res[case]['megatron'][0]['index_bytes'] * mb:,.0f} MiB"
        print(line)
        for name, row in ours["datasets"].items():
            print(f"  {name}: {row['documents']:,} documents, {row['epochs']} epochs, "
                  f"{row['samples']:,} samples built (requested {row['requested']:,}), "
                  f"separate last epoch: {'yes' if row['separate_last_epoch'] else 'no'}")

    rows = []  # (label, ours, megatron-core, gain, floor/limit, ours/floor)
    targets = []
    for case, title in (("single", f"single {args.epochs}-epoch build"),
                        ("blend", f"blend build, {args.blend_samples / 1e6:g}M samples")):
        ours_runs, mc_runs = res[case]["ours"], res[case]["megatron"]
        secs = [r["seconds"] for r in ours_runs]
        mem = [(r["peak"] - r["rss_before"]) * mb for r in ours_runs]
        floor_s = [f[case]["seconds"] for f in floors]
        floor_mem = [f[case]["peak_above"] * mb for f in floors]
        mc_secs = [r["seconds"] for r in mc_runs]
        mc_mem = [(r["peak"] - r["rss_before"]) * mb for r in mc_runs]
        gain = ratio(mc_secs, secs) if with_mcore else None
        mem_gain = ratio(mc_mem, mem) if with_mcore else None
        rows.append((f"{title}, s", median(secs), median(mc_secs), gain, median(floor_s),
                     ratio(secs, floor_s)))
        rows.append((f"{title}, peak MiB", median(mem), median(mc_mem), mem_gain,
                     median(floor_mem), ratio(mem, floor_mem)))
        if with_mcore:
            target = 1.3 if case == "single" else 1.0  # issue 20: the single build >= 1.3x
            targets.append(f"target: {title} >= {target:g}x megatron-core's speed: "
                           f"{gain:.2f}x {'PASS' if gain >= target else 'FAIL'}; no more memory: "
                           f"{median(mem):,.0f} vs {median(mc_mem):,.0f} MiB "
                           f"{'PASS' if median(mem) <= median(mc_mem) else 'FAIL'}")
    rates = {k: [a["rates"][k] for a in accesses] for k in accesses[0]["rates"]}
    for key, label in (("mcore_getitem", "random access ds[i] (mcore: __getitem__), samples/s"),
                       ("mcore_query", "random access ds[i] (mcore: _query_...), samples/s")):
        theirs = rates.get(key, [])
        rows.append((label, median(rates["ours"]), median(theirs),
                     ratio(rates["ours"], theirs) if theirs else None, median(rates["memcpy"]),
                     ratio(rates["ours"], rates["memcpy"])))

    def cell(value, fmt, width=14):
        return f"{'-':>{width}}" if value is None or math.isnan(value) else format(value, fmt)

    header = (f"{'measurement':<52} {'ours':>14} {'megatron-core':>14} {'gain':>7} "
              f"{'floor/limit':>14} {'ours/floor':>10}")
    print()
    print(header)
    print("-" * len(header))
    for label, ours, theirs, gain, floor, vs_floor in rows:
        fmt = ">14.2f" if label.endswith(", s") else ">14,.0f"
        print(f"{label:<52} {cell(ours, fmt)} {cell(theirs, fmt)} {cell(gain, '>6.2f', 6)}"
              f"{'x' if gain is not None else ' '} {cell(floor, fmt)} "
              f"{cell(vs_floor, '>10.2f', 10)}")
    print(f"median of {args.repeats} rounds (ours and megatron-core alternate going first). "
          "gain: megatron-core / ours for s and MiB, ours / megatron-core for samples/s, the "
          "median of per-round ratios; > 1 = ours better. peak MiB: ru_maxrss after the build "
          "minus the RSS just before it. floor, s: the shuffles of the document and shuffle "
          "indices alone, ours (compiled, the same permutations as RandomState.shuffle; "
          "numba's import and kernel load apart); floor, MiB: the peak of holding those arrays, "
          "one dataset at a time. limit, samples/s: copying L+1 tokens from each sample's "
          "start in the memory-mapped .bin into a preallocated int64 buffer.")
    numpy_floor = ", ".join(f"{case} {median([f[case]['numpy_seconds'] for f in floors]):.2f} s"
                            for case in cases)
    print(f"the same shuffles by numpy's RandomState.shuffle (megatron-core's): {numpy_floor}; "
          f"numba's import and kernel load before ours: "
          f"{median([f['compiled_load'] for f in floors]):.2f} s (paid by every build process "
          "that shuffles >= 1M entries, inside ours, s)")
    base = f"ours {median([r['rss_before'] * mb for c in cases for r in res[c]['ours']]):,.0f}"
    if with_mcore:
        base += (", megatron-core "
                 f"{median([r['rss_before'] * mb for c in cases for r in res[c]['megatron']]):,.0f}"
                 " (torch imported)")
    peaks = ", ".join(f"{case} {b} {median([r['peak'] * mb for r in res[case][b]]):,.0f}"
                      for case in cases for b in res[case] if res[case][b])
    print(f"baseline RSS after imports (MiB): {base}; absolute peak RSS (MiB): {peaks}")
    warm, first = accesses[0]["warm"], accesses[0]
    print(f"random access: {first['samples']:,} random i of {first['dataset_samples']:,} "
          f"samples, the same i for all; page cache warmed first (the .bin read once: "
          f"{warm['bytes'] / 1e9:.2f} GB at {warm['bytes'] / warm['seconds'] / 1e9:.1f} GB/s); "
          f"the limit moves {median(rates['memcpy']) * (SEQ_LENGTH + 1) * 2 / 1e9:.2f} GB/s "
          "of uint16 tokens")
    report_batched(accesses)
    problems = []
    for case in cases:
        for r in res[case]["ours"] + res[case]["megatron"]:
            if abs(r["peak"] - r["hwm"]) > 0.05 * r["peak"] or r["peak"] <= r["maxrss_before"]:
                problems.append(f"{case}: ru_maxrss {r['peak'] * mb:,.0f} MiB, VmHWM "
                                f"{r['hwm'] * mb:,.0f} MiB, ru_maxrss before the build "
                                f"{r['maxrss_before'] * mb:,.0f} MiB: the peak may be inexact")
    if with_mcore:
        identical = all(c["identical"] for case in cases for c in compares[case])
        details = []
        for case in cases:
            arrays = ", ".join(
                f"{r['array']} {'x'.join(map(str, r['shape']))} {'/'.join(r['dtypes'])}"
                f"{'' if r['equal'] else ' DIFFERS'}" if "shape" in r else
                f"{r['array']} {r['note']}" for r in compares[case][0]["rows"])
            details.append(f"{case}: {arrays}")
        print(f"identical: {'yes' if identical else 'NO'} (every round; arrays "
              f"ours/megatron-core dtype) " + "; ".join(details))
        checked = [a["checked"] for a in accesses]
        print(f"ds[i] tokens equal to megatron-core's _query_document_sample_shuffle_indices "
              f"for {checked[0]['samples']:,} of the random i: "
              f"{'yes' if all(c['equal'] for c in checked) else 'NO'}")
        if not identical or not all(c["equal"] for c in checked):
            problems.append("indices or samples differ from megatron-core's")
        for line in targets:
            print(line)
    else:
        print("megatron-core not measured (--skip-megatron, or not installed): ours only")
    for problem in problems:
        print(f"warning: {problem}")
    if args.json:
        print(json.dumps({"stats": stats, "builds": res, "floors": floors, "access": accesses,
                          "compare": compares, "rows": rows}, indent=1))
    return 1 if any("differ" in p for p in problems) else 0


def report_blend_rows(args, with_mcore) -> int:
    """Blend indices alone, ours against megatron-core's helper, per dataset count; and the
    first call of a fresh process. Returns 1 if an index differs."""
    samples = int(1e6 if args.quick else args.blend_rows_samples)
    counts = [int(v) for v in args.blend_rows_datasets.split(",")]
    print("blend rows: first calls in fresh processes ...", flush=True)
    numba_cache = fresh_dir(args.cache_dir / "blend_rows_numba_cache")
    try:
        cold, warm = (run_child("blend_first", {"numba_cache": str(numba_cache),
                                                "with_mcore": with_mcore}) for _ in range(2))
    finally:
        shutil.rmtree(numba_cache, ignore_errors=True)
    print(f"blend rows: {samples:,} samples, {args.blend_rows_repeats} rounds ...", flush=True)
    result = run_child("blend_rows", {"samples": samples, "datasets": counts,
                                      "repeats": args.blend_rows_repeats,
                                      "with_mcore": with_mcore})
    rows = result["rows"]
    header = (f"{'blend indices, datasets':<24} {'kernel':>8} {'megatron-core s':>15} "
              f"{'ours s':>8} {'ours/mcore':>10} {'(cpu)':>6} {'other kernel s':>16} "
              f"{'other cores':>11} {'identical':>9}")
    print()
    print(header)
    print("-" * len(header))
    passed, differ = True, False
    for row in rows:
        ours, theirs = row["runs"]["ours"], row["runs"]["megatron"]
        unchosen = f"{row['unchosen']} {median(row['runs']['unchosen']['wall']):.3f}"
        wall = ratio(ours["wall"], theirs["wall"]) if theirs["wall"] else None
        cpu = ratio(ours["cpu"], theirs["cpu"]) if theirs["cpu"] else None
        other = median(ours["other"] + theirs["other"] + row["runs"]["unchosen"]["other"])
        passed &= wall is not None and wall <= 1
        differ |= row["identical"] is False
        same = "yes" if row["identical"] else "NO"
        print(f"{row['datasets']:<24} {row['kernel']:>8} "
              f"{median(theirs['wall']) or float('nan'):>15.3f} {median(ours['wall']):>8.3f} "
              f"{wall or float('nan'):>9.2f}x {cpu or float('nan'):>5.2f}x {unchosen:>16} "
              f"{other:>11.2f} {same:>9}")
    print(f"median of {args.blend_rows_repeats} rounds (the builders' order reversed every "
          "other round); ours/mcore: the median of per-round ratios of wall seconds, (cpu): of "
          "this process's CPU seconds; other kernel: ours forced to the kernel not chosen; other "
          "cores: cores other processes kept busy meanwhile (median); identical: all three. "
          "Weights lognormal(sigma 1), normalized; megatron-core's helper writes into "
          "numpy.zeros arrays allocated in the timed span, as its BlendedDataset does; "
          "ours allocates its own.")
    print(f"limit: allocating both outputs and writing each once (int16 + int64, "
          f"{samples * 10 / 1e6:.0f} MB), which any builder must: "
          f"{median(result['write_floor']):.3f} s (median)")
    first = (f"first call in a fresh process (not in the rows): ours, numba's import + "
             f"compiling the segment kernel {cold['ours_segments']:.2f} s, the wake kernel "
             f"{cold['ours_wake']:.2f} s; with numba's cache (every later process) "
             f"{warm['ours_segments']:.2f} s + {warm['ours_wake']:.2f} s")
    if with_mcore:
        first += (f"; megatron-core, importing its helpers + the call: "
                  f"{warm['megatron']:.2f} s")
        print(first)
        print(f"target: blend indices at most megatron-core's time at every dataset count: "
              f"{'PASS' if passed else 'FAIL'}; identical: {'NO' if differ else 'yes'}")
    else:
        print(first)
        print("megatron-core not measured (--skip-megatron, or not installed): ours only")
    if args.json:
        print(json.dumps({"blend_rows": rows, "blend_first": {"cold": cold, "warm": warm}},
                         indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
