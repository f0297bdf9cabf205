"""The build children of ``benchmarks.build_index``, each run in a fresh process
(``build_index_child``): ours and megatron-core's index builds (time, peak memory), the floor
(the shuffles alone), and the comparison of both builders' index arrays.

Contract: each ``child_*(cfg) -> dict`` takes and returns JSON-able dicts; memory is measured
within the child (``ru_maxrss`` after the build minus the RSS just before it), so nothing of
the parent or of another build counts.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.harness.token_corpus import SEED, SEQ_LENGTH, SINGLE, VOCAB

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
    # in the child only: numba's import and kernel load count in our build, as for a user
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
    # in the child only: the kernels' import is timed apart from the shuffles
    from bloomline.dataprep import gpt_index

    start = time.perf_counter()
    for dtype in (np.int32, np.uint32):  # import numba, load both kernels from its cache
        gpt_index.shuffle(np.random.RandomState(0),
                            np.arange(gpt_index._COMPILED_FROM, dtype=dtype))
    out, rss_before = {"compiled_load": time.perf_counter() - start}, rss_bytes()
    for case, components in cfg["cases"].items():  # single first: its peak is the smaller
        seconds = {"numpy": 0.0, "ours": 0.0}
        for comp in components:
            for way, shuffle in (("numpy", lambda rng, a: rng.shuffle(a)),
                                 ("ours", gpt_index.shuffle)):
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
