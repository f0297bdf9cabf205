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

Every build runs in a fresh child process (this script with ``--child``) into a fresh, empty
cache folder, so it is a build, not a cache hit, and the peak RSS is that build's alone: peak
memory is ``ru_maxrss`` after the build minus the RSS just before it (the RSS after imports,
torch included for megatron-core, is printed too); seconds are wall time around the build call
only. The floor of a build is what both builders must do in the order the RNG fixes: the
``RandomState.shuffle`` calls of the document and shuffle indices, timed alone for the same
sizes (and their peak memory: the shuffled arrays themselves). A child then compares our
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


def child_generate(cfg: dict) -> dict:
    """Three datasets a, b, c of ~1/3 of the tokens each (blend/), and their concatenation
    (single/all); each file is written atomically, so an existing .idx is complete."""
    from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter, merge_indexed_datasets

    root = Path(cfg["root"])
    blend, single = root / "blend", root / "single"
    names = list(WEIGHTS)
    for k, name in enumerate(names):
        if (blend / f"{name}.idx").exists():
            continue
        print(f"generating {blend / name} ...", flush=True)
        rng = np.random.default_rng(1000 + k)
        num_docs, num_tokens = cfg["docs"] // 3, cfg["tokens"] // 3
        raw = rng.lognormal(math.log(MEAN_DOC) - SIGMA_DOC**2 / 2, SIGMA_DOC, num_docs)
        lengths = np.maximum(1, np.round(raw * (num_tokens / raw.sum()))).astype(np.int64)
        with IndexedDatasetWriter(blend / name, np.uint16, overwrite=True) as writer:
            for start in range(0, num_docs, BATCH_DOCS):
                batch = lengths[start : start + BATCH_DOCS]
                writer.add_documents(
                    rng.integers(0, VOCAB, size=int(batch.sum()), dtype=np.uint16), batch)
    if not (single / f"{SINGLE}.idx").exists():
        print(f"concatenating them into {single / SINGLE} ...", flush=True)
        merge_indexed_datasets([blend / n for n in names], single / SINGLE, overwrite=True)
    stats = {}
    for path in [single / SINGLE] + [blend / n for n in names]:
        ds = IndexedDataset(path)
        lengths = np.asarray(ds.sequence_lengths)
        stats[str(path.relative_to(root))] = {
            "tokens": ds.num_tokens, "documents": len(ds), "bin_bytes": ds.bin_path.stat().st_size,
            "mean": float(lengths.mean()), "median": float(np.median(lengths)),
            "max": int(lengths.max())}
    return stats


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
    """The RandomState.shuffle calls both builders make, in the same sizes and dtypes, timed
    alone; one component at a time (each builder also finishes one before the next)."""
    out, rss_before = {}, rss_bytes()
    for case, components in cfg["cases"].items():  # single first: its peak is the smaller
        seconds = 0.0
        for comp in components:
            rng = np.random.RandomState(SEED)
            ids = np.arange(comp["documents"], dtype=np.int32)
            epochs = comp["epochs"]
            doc_parts = [epochs - 1, 1] if comp["separate"] and epochs > 1 else [epochs]
            arrays = []
            for part in doc_parts:
                array = np.tile(ids, part)
                start = time.perf_counter()
                rng.shuffle(array)
                seconds += time.perf_counter() - start
                arrays.append(array)
            bounds = [0, comp["first_shuffle"], comp["built"]]
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                if hi > lo:
                    array = np.arange(lo, hi, dtype=np.uint32)
                    start = time.perf_counter()
                    rng.shuffle(array)
                    seconds += time.perf_counter() - start
                    arrays.append(array)
            del arrays
        out[case] = {"seconds": seconds, "peak_above": maxrss_bytes() - rss_before}
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
    return {"rates": results, "warm": warm, "samples": len(picks), "checked": checked,
            "dataset_samples": len(ours)}


CHILDREN = {"generate": child_generate, "ours": child_ours, "megatron": child_megatron,
            "floor": child_floor, "compare": child_compare, "access": child_access}


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
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--skip-megatron", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="1e7 tokens, 2e4 documents, 1e6 blend samples, 20k accesses")
    parser.add_argument("--cache-dir", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = CHILDREN[args.child](json.loads(args.child_config))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.tokens, args.docs, args.blend_samples = 1e7, 2e4, 1e6
        args.access_samples = min(args.access_samples, 20_000)

    with_mcore = not args.skip_megatron and importlib.util.find_spec("megatron") is not None \
        and importlib.util.find_spec("megatron.core") is not None
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
                        "access_samples": args.access_samples}))
                for path in caches.values():
                    shutil.rmtree(path, ignore_errors=True)
            print(f"round {round_no}/{args.repeats}: floor (the RandomState shuffles) ...",
                  flush=True)
            floors.append(run_child("floor", {"cases": {
                case: floor_components(res[case]["ours"][-1]) for case in cases}}))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return report(args, stats, cases, res, floors, accesses, compares, with_mcore)


def report(args, stats, cases, res, floors, accesses, compares, with_mcore) -> int:
    mb = 1 / 2**20
    print(f"\ncorpus {args.cache_dir / f'build_index_{args.tokens:g}t_{args.docs:g}d'} "
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
            targets.append(f"target: {title} faster than megatron-core: {gain:.2f}x "
                           f"{'PASS' if gain > 1 else 'FAIL'}; no more memory: "
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
          "minus the RSS just before it. floor, s: the RandomState.shuffle calls of the "
          "document and shuffle indices alone; floor, MiB: the peak of holding those arrays, "
          "one dataset at a time. limit, samples/s: copying L+1 tokens from each sample's "
          "start in the memory-mapped .bin into a preallocated int64 buffer.")
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


if __name__ == "__main__":
    raise SystemExit(main())
