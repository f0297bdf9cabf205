"""Throughput of ``dataprep tokenize`` against the tokenizer's own limit and a baseline.

On a generated jsonl corpus (default ~100 MB, built deterministically from stdlib prose with
a long tail of document lengths and ~2% non-ASCII documents) it times two tokenizers trained
on that corpus (and cached): a 32k SentencePiece BPE (``.model``) and a 50,257-entry
byte-level BPE ``tokenizer.json`` (GPT-2's size; ``train_tokenizer(kind="byte-bpe")``, BLOOM's
pre-tokenizer, run by the Hugging Face ``tokenizers`` library).

SentencePiece:

  (a) the per-core limit: ``Tokenizer.encode_batch`` (SentencePiece's ``Encode`` returning
      numpy ids, one thread, as each worker uses) over in-memory texts, in the batches the
      pipeline's chunks make; the w-core limit: the same in w processes at once; and
      SentencePiece's own 2-thread batch encode for reference;
  (b) a naive single-process read-encode-write loop, one document at a time (what Megatron's
      ``preprocess_data.py`` does per worker), the baseline;
  (c) ``tokenize_corpus`` with each ``--workers`` count.

tokenizer.json:

  (a) the per-core limit: the library's ``encode_batch_fast`` on one thread
      (TOKENIZERS_PARALLELISM=false) over the same in-memory batches, each encoding's
      ``.ids`` read out (a Python list per document; no numpy, nothing of ours), called on a
      helper thread while the main thread waits; the w-core limit: the same in w processes;
      for reference the library's own thread pool (TOKENIZERS_PARALLELISM=true,
      RAYON_NUM_THREADS = the largest worker count) and the 1-thread encode called on the
      main thread, which runs slower: glibc's main malloc arena, which the interpreter
      shares, is slower for the library's many small allocations (a string per token) than
      the arena any other thread gets (``benchmarks/results/tokenize.md`` has by how much);
  (c) ``tokenize_corpus`` with the ``tokenizer.json`` folder and each ``--workers`` count,
      with TOKENIZERS_PARALLELISM unset, as users run it;
  (d) the baseline: ``datasets`` ``Dataset.map(batched=True)`` calling the same
      ``encode_batch_fast`` + ``.ids``, ``num_proc`` = each worker count, one thread per
      process. It starts from the corpus already in Arrow form (``load_dataset("json")``,
      done once and cached, not timed) and writes only map's own Arrow cache of int32 ids;
      the pipeline parses the jsonl and writes a Megatron .bin/.idx. Details:
      ``tokenize_contestants.datasets_map``.

Rounds run every measurement in turn (``--repeats`` rounds, default 3); each ratio is taken
within a round and the median over rounds reported, because a shared machine's speed drifts
from one minute to the next. It checks that every output is byte-identical (pipeline
for each worker count, and the naive loop for SentencePiece), that the pipeline's token count
is the limit's plus one EOD per document, and that every other contestant counts the limit's
tokens; then prints a table per tokenizer and the targets: >= 90% of the limit per worker,
>= 1.8x from 1 to 2 workers (this presumes 2 idle cores), and for tokenizer.json a scaling
within 5% of SentencePiece's in the same run.

Run: ``make bench-tokenize`` or ``python -m benchmarks.tokenize [--size-mb 20]``.
Corpus and tokenizers are cached in ``--cache-dir`` and reused on later runs. Writes
``benchmarks/results/bench_tokenize.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np

from benchmarks.harness.machine import OtherLoad, header_line, load_average, relative
from benchmarks.harness.paths import CACHE_DIR
from benchmarks.harness.table import write_result
from benchmarks.harness.text_corpus import byte_bpe_tokenizer, jsonl_corpus, sentencepiece_model
from benchmarks.harness.tokenize_contestants import (
    ConcurrentLimit,
    datasets_map,
    encode_all,
    limit_encoder,
    load_batches,
    load_hf_dataset,
    naive_loop,
    same_files,
)
from bloomline.dataprep.tokenize_corpus import tokenize_corpus
from bloomline.dataprep.tokenizer import load_tokenizer

__all__ = ["main", "measure", "report"]

SP, HF = "sentencepiece", "tokenizer.json"


@dataclass
class Measurement:
    name: str
    kind: str  # SP or HF
    nbytes: int  # what MB/s counts: text bytes (in memory) or jsonl bytes (read from disk)
    workers: int
    w_limit: str | None  # the w-core limit this row's %w-core is taken against
    baseline: str | None  # the row the "vs" column divides by
    fn: Callable[[], tuple[int, object]]  # -> (tokens, pipeline summary or None)
    parallelism: str | None = None  # TOKENIZERS_PARALLELISM while it runs (None: unset)


def sentencepiece_rows(a, corpus, model, batches, bytes_, limits) -> list[Measurement]:
    tok = load_tokenizer(model)
    text_bytes, jsonl_bytes = bytes_
    limit = "(a) sentencepiece encode_batch, 1 thread = per-core limit"
    naive = "(b) naive loop, 1 process"
    rows = [Measurement(limit, SP, text_bytes, 1, limit, naive,
                        lambda: (encode_all(batches, tok.encode_batch), None))]
    # Each pipeline run follows its own limit, so that the two of a pair run close in time.
    for w in a.workers:
        w_limit = limit
        if w > 1:
            w_limit = f"(a) sentencepiece encode_batch, {w} processes = {w}-core limit"
            limits[SP, w] = ConcurrentLimit(model, "tokenizer", batches, w)
            rows.append(Measurement(w_limit, SP, text_bytes, w, w_limit, naive,
                                    lambda lim=limits[SP, w]: (lim(), None)))

        def run_pipeline(w=w):
            summary = tokenize_corpus([str(corpus)], str(model), str(a.cache_dir / f"out_w{w}"),
                                      workers=w, overwrite=True, show_progress=False)
            return summary.num_tokens["text"], summary
        rows.append(Measurement(f"(c) tokenize_corpus, workers={w}", SP, jsonl_bytes, w,
                                w_limit, naive, run_pipeline))
    rows.append(Measurement(
        "(a) sentencepiece Encode, num_threads=2 (its own threads)", SP, text_bytes, 2, None,
        naive, lambda: (encode_all(
            batches, lambda b: tok._sp.Encode(b, out_type=int, num_threads=2)), None)))
    rows.append(Measurement(naive, SP, jsonl_bytes, 1, limit, naive, lambda: (
        naive_loop(corpus, tok, a.cache_dir / "out_naive"), None)))
    return rows


def tokenizer_json_rows(a, corpus, folder, batches, bytes_, limits) -> list[Measurement]:
    tok = load_tokenizer(folder)
    encode = limit_encoder(tok, "library")
    dataset = load_hf_dataset(corpus, a.cache_dir / "hf_datasets")
    text_bytes, jsonl_bytes = bytes_
    limit = "(a) encode_batch_fast + .ids, 1 thread = per-core limit"
    rows = [Measurement(limit, HF, text_bytes, 1, limit, None,
                        lambda: (encode_all(batches, encode), None), "false")]
    for w in a.workers:
        w_limit, base = limit, f"(d) datasets.map(batched=True), num_proc={w}"
        if w > 1:
            w_limit = f"(a) encode_batch_fast + .ids, {w} processes = {w}-core limit"
            limits[HF, w] = ConcurrentLimit(folder, "library", batches, w)
            rows.append(Measurement(w_limit, HF, text_bytes, w, w_limit, base,
                                    lambda lim=limits[HF, w]: (lim(), None), "false"))

        def run_pipeline(w=w):
            summary = tokenize_corpus([str(corpus)], str(folder),
                                      str(a.cache_dir / f"out_json_w{w}"), workers=w,
                                      overwrite=True, show_progress=False)
            return summary.num_tokens["text"], summary
        rows.append(Measurement(f"(c) tokenize_corpus, workers={w}", HF, jsonl_bytes, w, w_limit,
                                base, run_pipeline))
        rows.append(Measurement(base, HF, text_bytes, w, w_limit, base, lambda w=w: (
            datasets_map(dataset, tok.backend, w, a.cache_dir), None), "false"))
    maps = {r.workers: r.name for r in rows if r.name.startswith("(d)")}
    rows[0].baseline = maps.get(1)  # the 1-thread limit against map with num_proc=1
    threads = max(a.workers)
    on_main = limit_encoder(tok, "library-main-thread")
    rows.append(Measurement(f"(a) encode_batch_fast + .ids, {threads} threads (its own pool)",
                            HF, text_bytes, threads, None, maps.get(threads),
                            lambda: (encode_all(batches, on_main), None), "true"))
    rows.append(Measurement("(a) encode_batch_fast + .ids, 1 thread, on the main thread", HF,
                            text_bytes, 1, limit, maps.get(1),
                            lambda: (encode_all(batches, on_main), None), "false"))
    return rows


def run_rounds(rows: list[Measurement], repeats: int, limits: dict) -> dict:
    """Every row once per round; per row and round: wall seconds, CPU seconds of all our
    processes, and the cores other processes kept busy meanwhile."""
    live = lambda: sum(lim.cpu_seconds() for lim in limits.values())  # noqa: E731
    keys = [r.name + r.kind for r in rows]
    res = {"times": {k: [] for k in keys}, "cpu": {k: [] for k in keys},
           "other": {k: [] for k in keys}, "tokens": {}, "summaries": {}, "other_cores": []}
    for round_no in range(1, repeats + 1):
        round_load = OtherLoad(live).start()
        for r, key in zip(rows, keys, strict=True):
            print(f"round {round_no}/{repeats}: {r.kind}: {r.name} ...", flush=True)
            if r.parallelism is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = r.parallelism
            load = OtherLoad(live).start()
            start = time.perf_counter()
            res["tokens"][key], summary = r.fn()
            res["times"][key].append(time.perf_counter() - start)
            res["cpu"][key].append(load.own_cpu())
            res["other"][key].append(load.cores())
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
            if summary is not None:
                res["summaries"][r.kind, r.workers] = summary
        res["other_cores"].append(round_load.cores())
        print(f"round {round_no}/{repeats}: other processes kept {res['other_cores'][-1]:.2f} "
              "cores busy", flush=True)
    return res


def table(kind: str, rows: list[Measurement], res: dict, out) -> list[dict]:
    """Print one tokenizer's rows; return them as dicts with the medians of per-round ratios.

    A shared machine's speed drifts between minutes, so every ratio is taken
    within a round (between runs minutes apart at most) and the median over rounds is
    reported. Ratios compare times on the same documents: MB/s of (b)/(c) counts jsonl bytes
    (JSON syntax and escapes included), which would flatter them against (a).
    """
    mine = [r for r in rows if r.kind == kind]
    limit = mine[0].name  # the per-core limit comes first

    def t(name: str, what: str = "times") -> list[float]:
        return res[what][name + kind]

    def median_ratio(numerator: str, denominator: str, scale: float = 1.0,
                     what: str = "times") -> float:
        return float(np.median([scale * a / b for a, b in zip(
            t(numerator, what), t(denominator, what), strict=True)]))

    base_col = "vs naive" if kind == SP else "vs map"
    header = (f"{'measurement':<58} {'s':>6} {'MB/s':>6} {'tokens/s':>10} {'%lim/wkr':>8} "
              f"{'%w-core':>7} {'%lim cpu':>8} {base_col:>8}  seconds per round | other")
    out(header)
    out("-" * len(header))
    result = []
    for r in mine:
        secs = float(np.median(t(r.name)))
        num_tokens = res["tokens"][r.name + kind]
        row = {"name": r.name, "kind": kind, "seconds": secs, "all_seconds": t(r.name),
               "cpu_seconds": t(r.name, "cpu"), "other_cores": t(r.name, "other"),
               "workers": r.workers, "bytes": r.nbytes, "tokens": num_tokens,
               "mb_per_s": r.nbytes / secs / 1e6, "tokens_per_s": num_tokens / secs,
               "pct_of_limit_per_worker": median_ratio(limit, r.name, 100 / r.workers),
               "pct_of_w_core_limit": median_ratio(r.w_limit, r.name, 100) if r.w_limit
               else None,
               "pct_of_limit_cpu": median_ratio(limit, r.name, 100, "cpu"),
               "vs_baseline": median_ratio(r.baseline, r.name) if r.baseline else None,
               "baseline": r.baseline}
        result.append(row)
        w_core, vs = row["pct_of_w_core_limit"], row["vs_baseline"]
        out(f"{r.name:<58} {secs:>6.2f} {row['mb_per_s']:>6.2f} {num_tokens / secs:>10,.0f} "
            f"{row['pct_of_limit_per_worker']:>7.1f}% "
            + (f"{w_core:>6.1f}% " if w_core is not None else f"{'':>8}")
            + f"{row['pct_of_limit_cpu']:>7.1f}% "
            + (f"{vs:>7.2f}x " if vs is not None else f"{'':>9}")
            + " " + " ".join(f"{s:.2f}" for s in t(r.name)) + " | "
            + " ".join(f"{c:.2f}" for c in t(r.name, "other")))
    return result


def check(kind: str, a, rows: list[dict], summaries: dict, stats: dict) -> list[str]:
    """Correctness first: a fast wrong answer is not a result."""
    prefix = "out_w" if kind == SP else "out_json_w"
    first = a.cache_dir / f"{prefix}{a.workers[0]}"
    problems = [f"{kind}: {prefix}{w} differs from {first.name}" for w in a.workers[1:]
                if not same_files(first, a.cache_dir / f"{prefix}{w}")]
    if kind == SP and not same_files(first, a.cache_dir / "out_naive"):
        problems.append(f"{kind}: {first.name} differs from the naive loop's output")
    limit_tokens = rows[0]["tokens"]
    for (k, w), s in summaries.items():
        expected = limit_tokens + s.num_documents - s.num_empty["text"]
        if k == kind and s.num_tokens["text"] != expected:
            problems.append(f"{kind} workers={w}: {s.num_tokens['text']:,} tokens, expected "
                            f"{expected:,} (limit's tokens + one EOD per non-empty document)")
        if k == kind and s.num_documents != stats["documents"]:
            problems.append(f"{kind} workers={w}: {s.num_documents:,} documents of "
                            f"{stats['documents']:,}")
    for r in rows:  # every in-memory contestant encodes the same texts
        if r["name"][:3] in ("(a)", "(d)") and r["tokens"] != limit_tokens:
            problems.append(f"{kind}: {r['name']} counted {r['tokens']:,} tokens, the limit "
                            f"{limit_tokens:,}")
    return problems


def speedup(rows: list[dict], name_1: str, name_2: str) -> float:
    one = next(r for r in rows if r["name"] == name_1)["all_seconds"]
    two = next(r for r in rows if r["name"] == name_2)["all_seconds"]
    return float(np.median([x / y for x, y in zip(one, two, strict=True)]))


def targets(a, by_kind: dict[str, list[dict]], out) -> dict:
    results = {}
    scaling = {}
    for kind, rows in by_kind.items():
        pipe = {r["workers"]: r for r in rows if r["name"].startswith("(c)")}
        for w, r in pipe.items():
            ok = r["pct_of_limit_per_worker"] >= 90
            results[f"{kind}: efficiency_w{w}"] = ok
            out(f"target: {kind}: per-worker efficiency >= 90% of the 1-thread limit, workers={w}:"
                f" {r['pct_of_limit_per_worker']:.1f}% {'PASS' if ok else 'FAIL'} "
                f"({r['pct_of_w_core_limit']:.1f}% of the {w}-core limit)")
        if 1 in pipe and 2 in pipe:
            limit_2 = next(r["name"] for r in rows if r["name"].startswith("(a)")
                           and r["workers"] == 2 and r["pct_of_w_core_limit"] is not None)
            scaling[kind] = (speedup(rows, pipe[1]["name"], pipe[2]["name"]),
                             speedup(rows, rows[0]["name"], limit_2))
            ok = scaling[kind][0] >= 1.8
            results[f"{kind}: speedup_1_to_2"] = ok
            out(f"target: {kind}: speedup 1 -> 2 workers >= 1.8x: {scaling[kind][0]:.2f}x "
                f"{'PASS' if ok else 'FAIL'} (the limit itself: {scaling[kind][1]:.2f}x from 1 "
                f"to 2 processes; presumes 2 otherwise idle cores, os.cpu_count() = "
                f"{os.cpu_count()})")
        if kind == HF:
            for w, r in pipe.items():
                out(f"{kind}: tokenize_corpus workers={w} vs datasets.map num_proc={w}: "
                    f"{r['vs_baseline']:.2f}x as fast")
    if SP in scaling and HF in scaling:
        (sp, sp_lim), (hf, hf_lim) = scaling[SP], scaling[HF]
        ok = hf >= 1.8 and hf >= 0.95 * sp
        results["tokenizer.json scales like sentencepiece"] = ok
        out(f"target: tokenizer.json scales 1 -> 2 workers like sentencepiece (>= 1.8x and >= "
            f"95% of sentencepiece's): {hf:.2f}x vs {sp:.2f}x ({hf / sp:.0%}) "
            f"{'PASS' if ok else 'FAIL'}; their limits: {hf_lim:.2f}x vs {sp_lim:.2f}x")
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--vocab-size", type=int, default=32000, help="SentencePiece's")
    parser.add_argument("--bpe-vocab-size", type=int, default=50257,
                        help="the tokenizer.json's (byte-level BPE; GPT-2's size)")
    parser.add_argument("--tokenizers", nargs="+", choices=[SP, HF], default=[SP, HF])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--out", default="benchmarks/results/bench_tokenize.txt",
                        help="result file, relative to the repository ('' : none)")
    return parser.parse_args(argv)


def measure(a: argparse.Namespace) -> dict:
    """Every round of every row (``run_rounds``' dict), with the inputs the report names:
    ``{"args", "res", "rows", "stats", "bytes", "corpus", "model", "folder", "batches",
    "started", "load_before"}``."""
    started = time.perf_counter()
    cache: Path = a.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    # The thread-pool row's size; set before the library's pool starts (training starts it).
    os.environ["RAYON_NUM_THREADS"] = str(max(a.workers))
    load_before = load_average("before")
    corpus = jsonl_corpus(cache, a.size_mb)
    model = (sentencepiece_model(cache, corpus, a.size_mb, a.vocab_size)
             if SP in a.tokenizers else None)
    folder = (byte_bpe_tokenizer(cache, corpus, a.size_mb, a.bpe_vocab_size)
              if HF in a.tokenizers else None)
    batches, stats = load_batches(corpus)
    bytes_ = (stats["text_bytes"], corpus.stat().st_size)
    limits: dict = {}
    rows: list[Measurement] = []
    if SP in a.tokenizers:
        rows += sentencepiece_rows(a, corpus, model, batches, bytes_, limits)
    if HF in a.tokenizers:
        rows += tokenizer_json_rows(a, corpus, folder, batches, bytes_, limits)
    try:
        res = run_rounds(rows, a.repeats, limits)
    finally:
        for limit in limits.values():
            limit.close()
    return {"args": a, "res": res, "rows": rows, "stats": stats, "bytes": bytes_,
            "corpus": corpus, "model": model, "folder": folder, "batches": len(batches),
            "started": started, "load_before": load_before}


LEGEND = (
    "s: median of rounds; MB/s: text bytes for (a)/(d), jsonl bytes for (b)/(c); "
    "%lim/wkr = 1-thread limit's time / (time x workers); %w-core = the w-process limit's "
    "time / time; %lim cpu = the 1-thread limit's CPU seconds / the CPU seconds of all "
    "the row's processes (extra work, whatever the wall clock; other processes on the "
    "machine do not enter it); vs naive / vs map: the baseline's time / time (map: "
    "num_proc = the row's workers); other: the cores other processes of this machine kept "
    "busy during the row, per round (a neighbour on the host does not show there); "
    "ratios: median over rounds of each round's ratio.")
LIMITS = (
    "limits: sentencepiece = Encode(texts, return_type='numpy', num_threads=1), the ids "
    "as numpy arrays; tokenizer.json = encode_batch_fast(texts) with TOKENIZERS_PARALLELISM"
    "=false, then .ids of each encoding (Python lists), called on a helper thread while "
    "the main thread waits (on the main thread it runs slower: the 'on the main thread' "
    "row). Both on in-memory str batches, the pipeline's chunks (no file reading, no JSON, "
    "no EOD, nothing written).")


def _tables(m: dict, out) -> tuple[dict, list[str]]:
    """The corpus line, the load line and one table per tokenizer; (rows by kind, problems)."""
    a, res, stats, bytes_ = m["args"], m["res"], m["stats"], m["bytes"]
    out(f"corpus {m['corpus'].name} (in {relative(a.cache_dir)}): {stats['documents']:,} "
        f"documents ({stats['non_ascii']:,} non-ASCII), {bytes_[1] / 1e6:.1f} MB jsonl, "
        f"{bytes_[0] / 1e6:.1f} MB of text (avg {bytes_[0] / stats['documents']:,.0f} B/doc, "
        f"longest {stats['longest']:,} B); {a.repeats} rounds; batches: {m['batches']} (the "
        f"pipeline's chunks)")
    out("other processes kept " + ", ".join(f"{c:.2f}" for c in res["other_cores"])
        + " cores busy in rounds " + ", ".join(map(str, range(1, a.repeats + 1)))
        + (" (WARNING: shared machine, timings noisy)"
           if max(res["other_cores"]) > 0.25 else ""))
    by_kind, problems = {}, []
    for kind in a.tokenizers:
        vocab = load_tokenizer(m["model"] if kind == SP else m["folder"]).vocab_size
        out()
        out(f"{kind}: {'SentencePiece BPE' if kind == SP else 'byte-level BPE tokenizer.json'}, "
            f"vocabulary {vocab:,}")
        by_kind[kind] = table(kind, m["rows"], res, out)
        problems += check(kind, a, by_kind[kind], res["summaries"], stats)
        out(f"tokens (limit, without EOD): {by_kind[kind][0]['tokens']:,} "
            f"({bytes_[0] / by_kind[kind][0]['tokens']:.2f} text bytes per token)")
    return by_kind, problems


def report(m: dict) -> int:
    """Print the tables, the legend, the correctness line and the targets; write ``--out``
    (with the header) and, with ``--json``, print the rows as JSON. 1 if an output differed."""
    a = m["args"]
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line)
        lines.append(line)

    by_kind, problems = _tables(m, out)
    out()
    out(LEGEND)
    out(LIMITS)
    out("correctness: " + ("outputs byte-identical across workers " f"{a.workers}"
                           + (" and to the naive loop" if SP in a.tokenizers else "")
                           + "; pipeline tokens = limit + EOD count; every (a)/(d) row counts "
                           "the limit's tokens"
                           if not problems else "FAILED: " + "; ".join(problems)))
    results = targets(a, by_kind, out)
    header = (header_line(f"tokenizers {version('tokenizers')}, sentencepiece "
                          f"{version('sentencepiece')}, datasets {version('datasets')}",
                          started=m["started"])
              + f"\n{m['load_before']}; os.cpu_count() = {os.cpu_count()}\n")
    write_result(a.out, header, lines)
    if a.json:
        print(json.dumps({"corpus": m["stats"], "rows": [r for k in by_kind.values() for r in k],
                          "targets": results, "problems": problems,
                          "other_cores": m["res"]["other_cores"], "cpu_count": os.cpu_count()},
                         indent=2))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
