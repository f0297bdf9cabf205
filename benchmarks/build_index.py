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

Every build runs in a fresh child process (``build_index_child``) into a fresh, empty
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
reported, because a shared machine's speed drifts from one minute to the next.

Then the blend indices alone (``build_index_blend_rows``): ours against megatron-core's helper
per dataset count, and the first call of a fresh process.

Run: ``make bench-build-index`` or ``python -m benchmarks.build_index [--quick]
[--skip-megatron] [--blend-rows-only]``. Disk, memory and run time of the full run:
``benchmarks/results/build_index.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.build_index_access import BATCH_SIZES
from benchmarks.build_index_blend_rows import BLEND_DATASETS
from benchmarks.build_index_builds import fresh_dir
from benchmarks.build_index_report import report_blend_rows, report_builds
from benchmarks.harness.machine import header_line, load_average
from benchmarks.harness.paths import CACHE_DIR, REPO
from benchmarks.harness.token_corpus import SEQ_LENGTH, SINGLE, WEIGHTS, token_corpus_root

__all__ = ["main", "measure", "report"]


def run_child(kind: str, cfg: dict) -> dict:
    """``build_index_child``'s result for ``kind`` run in a fresh process on ``cfg``; its
    progress lines printed with a ``[kind]`` prefix. Exits if the child fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, "-m", "benchmarks.build_index_child", kind, json.dumps(cfg)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        else:
            print(f"  [{kind}] {line}", flush=True)
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"child {kind} failed (exit {proc.returncode})")
    return result


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
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
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.docs, args.blend_samples = 1e7, 2e4, 1e6
        args.access_samples = min(args.access_samples, 20_000)
        args.batch_samples = min(args.batch_samples, 20_000)
    return args


def _print_header() -> None:
    versions = []
    if importlib.util.find_spec("megatron") is not None:
        from importlib.metadata import PackageNotFoundError, version
        try:
            versions.append(f"megatron-core {version('megatron-core')}")
        except PackageNotFoundError:
            pass
    print(header_line(*versions), flush=True)
    print(load_average("before"), flush=True)


def _round(round_no: int, args, cases: dict, builders: list, runs: Path, got: dict) -> None:
    """One round: each case built by each builder (the order alternating), compared, the
    access child after the single build, then the floor; appended to ``got``'s lists."""
    order = builders if round_no % 2 else builders[::-1]
    with_mcore = "megatron" in builders
    for case, cfg in cases.items():
        caches = {b: fresh_dir(runs / f"{case}-{b}") for b in builders}
        for builder in order:
            print(f"round {round_no}/{args.repeats}: {case} build, {builder} ...", flush=True)
            got["res"][case][builder].append(
                run_child(builder, {**cfg, "cache": str(caches[builder])}))
        if with_mcore:
            print(f"round {round_no}/{args.repeats}: {case}: comparing indices ...", flush=True)
            got["compares"][case].append(run_child("compare", {
                "ours_cache": str(caches["ours"]), "mcore_cache": str(caches["megatron"])}))
        if case == "single":
            print(f"round {round_no}/{args.repeats}: random access ...", flush=True)
            got["accesses"].append(run_child("access", {
                "corpus": cfg["corpus"], "samples": cfg["samples"],
                "ours_cache": str(caches["ours"]),
                "mcore_cache": str(caches["megatron"]) if with_mcore else None,
                "access_samples": args.access_samples,
                "blend_corpus": cases["blend"]["corpus"],
                "batch_samples": args.batch_samples, "batch_sizes": args.batch_sizes,
                "batch_rounds": args.batch_rounds,
                "batch_blend_samples": args.batch_blend_samples}))
        for path in caches.values():
            shutil.rmtree(path, ignore_errors=True)
    print(f"round {round_no}/{args.repeats}: floor (the shuffles) ...", flush=True)
    got["floors"].append(run_child("floor", {"cases": {
        case: floor_components(got["res"][case]["ours"][-1]) for case in cases}}))


def measure_builds(args, with_mcore: bool) -> dict:
    """The corpus (generated when missing) and ``--repeats`` rounds of builds, comparisons,
    accesses and floors: ``{"stats", "cases", "res", "floors", "accesses", "compares"}``."""
    root = token_corpus_root(args.cache_dir, args.tokens, args.docs)
    root.mkdir(parents=True, exist_ok=True)
    stats = run_child("generate", {"root": str(root), "tokens": int(args.tokens),
                                   "docs": int(args.docs)})
    single_tokens = stats[f"single/{SINGLE}"]["tokens"]
    single_samples = args.epochs * ((single_tokens - 1) // SEQ_LENGTH)
    runs = root / "runs"
    shutil.rmtree(runs, ignore_errors=True)  # leftovers of an interrupted run
    cases = {"single": {"corpus": str(root / "single"), "samples": single_samples,
                        "weights": None},
             "blend": {"corpus": str(root / "blend"), "samples": int(args.blend_samples),
                       "weights": WEIGHTS}}
    got = {"stats": stats, "cases": cases, "floors": [], "accesses": [],
           "res": {c: {"ours": [], "megatron": []} for c in cases},
           "compares": {c: [] for c in cases}}
    builders = ["ours", "megatron"] if with_mcore else ["ours"]
    try:
        for round_no in range(1, args.repeats + 1):
            _round(round_no, args, cases, builders, runs, got)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return got


def measure_blend_rows(args, with_mcore: bool) -> dict:
    """The blend indices alone: the first call of two fresh processes (a compile, then a
    cache load) and the rows per dataset count: ``{"samples", "cold", "warm", "result"}``."""
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
    return {"samples": samples, "cold": cold, "warm": warm, "result": result}


def measure(args: argparse.Namespace) -> dict:
    """``{"args", "with_mcore", "builds": measure_builds' dict or None (--blend-rows-only),
    "blend_rows": measure_blend_rows' dict or None (--skip-blend-rows)}``."""
    _print_header()
    with_mcore = not args.skip_megatron and importlib.util.find_spec("megatron") is not None \
        and importlib.util.find_spec("megatron.core") is not None
    builds = None if args.blend_rows_only else measure_builds(args, with_mcore)
    skip_rows = args.skip_blend_rows and not args.blend_rows_only
    blend_rows = None if skip_rows else measure_blend_rows(args, with_mcore)
    return {"args": args, "with_mcore": with_mcore, "builds": builds, "blend_rows": blend_rows}


def report(measured: dict) -> int:
    """Print the builds' part and the blend rows; 1 if any index or sample differs from
    megatron-core's."""
    code = 0
    if measured["builds"] is not None:
        code = report_builds(measured["args"], measured["builds"], measured["with_mcore"])
    if measured["blend_rows"] is not None:
        code = max(code, report_blend_rows(measured["args"], measured["blend_rows"],
                                           measured["with_mcore"]))
    return code


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
