"""Throughput of ``dataprep tokenize`` against the tokenizer's own limit and a naive loop.

On a generated jsonl corpus (default ~200 MB, built deterministically from stdlib prose with
a long tail of document lengths and ~2% non-ASCII documents) it times:

  (a) the per-core limit: ``Tokenizer.encode_batch`` (one thread, as each worker uses) over
      in-memory texts, in the batches the pipeline's chunks make; the w-core limit: the same
      in w processes at once; and SentencePiece's own 2-thread batch encode for reference;
  (b) a naive single-process read-encode-write loop, one document at a time (what Megatron's
      ``preprocess_data.py`` does per worker);
  (c) ``tokenize_corpus`` with each ``--workers`` count.

Rounds run every measurement in turn (``--repeats`` rounds, default 3); each ratio is taken
within a round and the median over rounds reported, because this machine's speed drifts by 10%
and more from one minute to the next. It checks that every output is
byte-identical (pipeline for each worker count and the naive loop) and that the pipeline's
token count is the limit's plus one EOD per document, then prints a table and the targets:
>= 90% of the limit per worker, >= 1.8x from 1 to 2 workers (this presumes 2 idle cores).

Run: ``make bench-tokenize`` or ``.venv/bin/python benchmarks/bench_tokenize.py [--size-mb 20]``.
Corpus and tokenizer are cached in ``--cache-dir`` and reused on later runs.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import multiprocessing
import os
import re
import time
from pathlib import Path

import numpy as np

from bloomline.dataprep.demo_corpus import iter_stdlib_documents
from bloomline.dataprep.indexed_dataset import write_index
from bloomline.dataprep.pipeline import tokenize_corpus
from bloomline.dataprep.sources import expand_inputs, iter_chunks
from bloomline.dataprep.tokenizer import Tokenizer, load_tokenizer, train_tokenizer

# Sentences outside the tokenizer's usual alphabet: rare enough in the corpus that many of
# their characters go through SentencePiece's byte-fallback path.
NON_ASCII = [
    "Функция возвращает новый список, не изменяя исходный.",
    "Если файл не найден, возбуждается исключение OSError.",
    "この関数は文字列を受け取り、バイト列を返します。",
    "引数が省略された場合は、既定のエンコーディングが使われます。",
    "该函数返回一个迭代器，按顺序产生每一行。",
    "缓冲区满时，写入操作会阻塞直到有空间可用。",
    "이 메서드는 스레드에 안전하지 않습니다.",
    "Η συνάρτηση επιστρέφει το μήκος της ακολουθίας.",
    "Ça marche déjà très bien — même avec des caractères accentués.",
    "Build passed ✅ tests green 🎉 deploy 🚀 coffee ☕ bugs 🐛🐛",
]
NON_ASCII_SHARE = 0.02


def build_corpus(path: Path, size_mb: float) -> None:
    """Write ~size_mb MB of jsonl documents drawn from stdlib paragraphs (seeded, so fixed)."""
    texts = [doc["text"] for doc in iter_stdlib_documents()]
    paras = [p for t in texts for p in re.split(r"\n\s*\n", t) if p.strip()]
    para_bytes = np.array([len(p.encode()) + 2 for p in paras])  # + the "\n\n" joining them
    rng = np.random.default_rng(1234)
    target = size_mb * 1e6
    # Lognormal lengths: median ~1.6 KB, mean ~3 KB, a few documents of ~100 KB.
    mu, sigma = np.log(3000) - 1.1**2 / 2, 1.1
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    written = 0
    try:
        with open(tmp, "wb") as fh:
            doc_id = 0
            while written < target:
                want = float(np.clip(rng.lognormal(mu, sigma), 200, 120_000))
                # Draw a generous batch of paragraphs, keep those that reach the length.
                idx = rng.integers(0, len(paras), size=int(want / 80) + 4)
                keep = int(np.searchsorted(np.cumsum(para_bytes[idx]), want)) + 1
                doc = [paras[i] for i in idx[:keep]]
                if rng.random() < NON_ASCII_SHARE:
                    for pos in sorted(rng.integers(0, len(doc) + 1, size=len(doc) // 2 + 1),
                                      reverse=True):
                        picks = rng.integers(0, len(NON_ASCII), size=rng.integers(1, 4))
                        doc.insert(int(pos), " ".join(NON_ASCII[i] for i in picks))
                line = json.dumps({"id": doc_id, "text": "\n\n".join(doc)}, ensure_ascii=False)
                written += fh.write((line + "\n").encode())
                doc_id += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def encode_all(batches: list[list[str]], encode) -> int:
    return sum(sum(map(len, encode(batch))) for batch in batches)


def _limit_worker(model: str, batches: list[list[str]], tasks, results) -> None:
    tok = load_tokenizer(model)
    results.put(0)  # ready: the model is loaded, the texts are in memory
    while (index := tasks.get()) is not None:
        results.put(sum(map(len, tok.encode_batch(batches[index]))))


class ConcurrentLimit:
    """The w-core limit: w processes encoding in-memory texts at once, nothing else running.

    When all cores are busy each may run at another speed than one busy core alone (shared
    caches and memory, and on a virtual machine its neighbours), so the per-worker efficiency
    of w workers is shown against this limit too. Batches are handed out from a queue, as
    the pipeline hands out chunks; the processes start (and load their copy of the texts)
    before the clock starts.
    """

    def __init__(self, model: Path, batches: list[list[str]], workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.num_batches = len(batches)
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_limit_worker,
                                  args=(str(model), batches, self.tasks, self.results))
                      for _ in range(workers)]
        for proc in self.procs:
            proc.start()
        for _ in self.procs:
            self.results.get()

    def __call__(self) -> int:
        for index in range(self.num_batches):
            self.tasks.put(index)
        return sum(self.results.get() for _ in range(self.num_batches))

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for proc in self.procs:
            proc.join()


def naive_loop(corpus: Path, tok: Tokenizer, prefix: Path) -> int:
    """Megatron-style: one document at a time through Python, .idx written at the end."""
    lengths, doc_bounds, num_tokens = [], [0], 0
    with open(corpus, encoding="utf-8") as fin, open(f"{prefix}.bin", "wb") as fout:
        for line in fin:
            ids = tok._sp.Encode(json.loads(line)["text"], out_type=int)
            if ids:  # Megatron's convention: an empty document gets no EOD and no sequence
                ids.append(tok.eod_id)
                fout.write(np.array(ids, dtype=tok.token_dtype).tobytes())
                lengths.append(len(ids))
                num_tokens += len(ids)
            doc_bounds.append(len(lengths))
    write_index(f"{prefix}.idx", tok.token_dtype, np.array(lengths, dtype=np.int64),
                np.array(doc_bounds, dtype=np.int64))
    return num_tokens


def same_files(a: Path, b: Path) -> bool:
    return all(filecmp.cmp(f"{a}{s}", f"{b}{s}", shallow=False) for s in (".bin", ".idx"))


def load_batches(corpus: Path) -> tuple[list[list[str]], dict]:
    """Every text in memory, batched as the pipeline cuts the file into chunks (one worker)."""
    with open(corpus, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    batches, start = [], 0
    for chunk in iter_chunks(expand_inputs([str(corpus)])):
        count = chunk.payload.count(b"\n")
        batches.append(texts[start : start + count])
        start += count
    assert start == len(texts), "chunk line counts do not cover the corpus"
    sizes = [len(t.encode()) for t in texts]
    return batches, {"documents": len(texts), "text_bytes": sum(sizes), "longest": max(sizes),
                     "non_ascii": sum(not t.isascii() for t in texts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200)
    parser.add_argument("--cache-dir", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    cache: Path = args.cache_dir
    cache.mkdir(parents=True, exist_ok=True)

    # The size is in the name, so a corpus of another size is generated beside, not reused.
    corpus = cache / f"bench_{args.size_mb:g}mb.jsonl"
    if not corpus.exists():
        print(f"generating {corpus} ...", flush=True)
        build_corpus(corpus, args.size_mb)
    model = cache / f"bench_{args.size_mb:g}mb_v{args.vocab_size}.model"
    if not model.exists():
        print(f"training a {args.vocab_size}-piece tokenizer on it ...", flush=True)
        train_tokenizer([str(corpus)], model.with_suffix(""), args.vocab_size,
                        max_sentences=300_000, overwrite=True)
    tok = load_tokenizer(model)

    batches, stats = load_batches(corpus)
    jsonl_bytes, text_bytes = corpus.stat().st_size, stats["text_bytes"]

    naive = cache / "out_naive"
    limit_name = "(a) sentencepiece encode_batch, 1 thread = per-core limit"
    naive_name = "(b) naive loop, 1 process"
    concurrent_limits = {w: ConcurrentLimit(model, batches, w) for w in args.workers if w > 1}
    # name -> (bytes, workers, w-core limit's name, fn returning (tokens, summary or None)).
    # Each pipeline run follows its own limit, so that the two of a pair run close in time.
    measurements = {limit_name: (text_bytes, 1, limit_name, lambda: (
        encode_all(batches, tok.encode_batch), None))}
    for w in args.workers:
        w_limit = limit_name
        if w > 1:
            w_limit = f"(a) sentencepiece encode_batch, {w} processes = {w}-core limit"
            measurements[w_limit] = (text_bytes, w, w_limit,
                                     lambda limit=concurrent_limits[w]: (limit(), None))

        def run_pipeline(w=w):
            summary = tokenize_corpus([str(corpus)], str(model), str(cache / f"out_w{w}"),
                                      workers=w, overwrite=True, show_progress=False)
            return summary.num_tokens["text"], summary
        measurements[f"(c) tokenize_corpus, workers={w}"] = (jsonl_bytes, w, w_limit,
                                                             run_pipeline)
    measurements["(a) sentencepiece Encode, num_threads=2 (its own threads)"] = (
        text_bytes, 2, None, lambda: (encode_all(
            batches, lambda b: tok._sp.Encode(b, out_type=int, num_threads=2)), None))
    measurements[naive_name] = (jsonl_bytes, 1, limit_name,
                                lambda: (naive_loop(corpus, tok, naive), None))

    times: dict[str, list[float]] = {name: [] for name in measurements}
    tokens, summaries = {}, {}
    for round_no in range(1, args.repeats + 1):
        for name, (_, workers, _, fn) in measurements.items():
            print(f"round {round_no}/{args.repeats}: {name} ...", flush=True)
            start = time.perf_counter()
            tokens[name], summary = fn()
            times[name].append(time.perf_counter() - start)
            if summary is not None:
                summaries[workers] = summary
    for limit in concurrent_limits.values():
        limit.close()
    limit_tokens = tokens[limit_name]

    # The machine's speed drifts by 10% and more between minutes, so every ratio is taken
    # within a round (between runs minutes apart at most) and the median over rounds is
    # reported. Ratios compare times on the same documents: MB/s of (b)/(c) counts jsonl bytes
    # (JSON syntax and escapes included), which would flatter them against (a).
    def median_ratio(numerator: str, denominator: str, scale: float = 1.0) -> float:
        return float(np.median([scale * a / b for a, b in zip(times[numerator],
                                                              times[denominator], strict=True)]))

    rows = []
    for name, (nbytes, workers, w_limit, _) in measurements.items():
        secs = float(np.median(times[name]))
        rows.append({
            "name": name, "seconds": secs, "all_seconds": times[name], "workers": workers,
            "bytes": nbytes, "tokens": tokens[name], "mb_per_s": nbytes / secs / 1e6,
            "tokens_per_s": tokens[name] / secs,
            "pct_of_limit_per_worker": median_ratio(limit_name, name, 100 / workers),
            "pct_of_w_core_limit": median_ratio(w_limit, name, 100) if w_limit else None,
            "vs_naive": median_ratio(naive_name, name),
        })

    header = f"{'measurement':<58} {'s':>8} {'MB/s':>8} {'tokens/s':>12} {'%lim/wkr':>9} " \
             f"{'%w-core':>8} {'vs naive':>9}"
    print(f"\ncorpus {corpus}: {stats['documents']:,} documents ({stats['non_ascii']:,} "
          f"non-ASCII), {jsonl_bytes / 1e6:.1f} MB jsonl, {text_bytes / 1e6:.1f} MB of text "
          f"(avg {text_bytes / stats['documents']:,.0f} B/doc, longest {stats['longest']:,} B), "
          f"{limit_tokens:,} tokens + EOD; vocab {tok.vocab_size}; "
          f"os.cpu_count() = {os.cpu_count()}")
    print(header)
    print("-" * len(header))
    for r in rows:
        w_core = r["pct_of_w_core_limit"]
        w_core = f"{w_core:>7.1f}%" if w_core is not None else f"{'':>8}"
        print(f"{r['name']:<58} {r['seconds']:>8.2f} {r['mb_per_s']:>8.2f} "
              f"{r['tokens_per_s']:>12,.0f} {r['pct_of_limit_per_worker']:>8.1f}% "
              f"{w_core} {r['vs_naive']:>8.2f}x")
    print(f"s: median of {args.repeats} rounds; MB/s: text bytes for (a), jsonl bytes for (b)/(c); "
          "%lim/wkr = 1-thread limit's time / (time x workers); %w-core = the w-process "
          "limit's time / time; ratios: median over rounds of each round's ratio.")
    return report(args, rows, summaries, limit_tokens, naive, cache, stats)


def report(args, rows, summaries, limit_tokens, naive, cache, stats) -> int:
    # Correctness first: a fast wrong answer is not a result.
    first = cache / f"out_w{args.workers[0]}"
    problems = [f"out_w{w} differs from {first.name}" for w in args.workers[1:]
                if not same_files(first, cache / f"out_w{w}")]
    if not same_files(first, naive):
        problems.append(f"{first.name} differs from the naive loop's output")
    for w, s in summaries.items():
        expected = limit_tokens + s.num_documents - s.num_empty["text"]
        if s.num_tokens["text"] != expected:
            problems.append(f"workers={w}: {s.num_tokens['text']:,} tokens, expected "
                            f"{expected:,} (limit's tokens + one EOD per non-empty document)")
    print("correctness: " + ("outputs byte-identical for workers " f"{args.workers} and the "
                             "naive loop; token count = (a) + EOD count"
                             if not problems else "FAILED: " + "; ".join(problems)))
    pipe = {r["workers"]: r for r in rows if r["name"].startswith("(c)")}
    results = {}
    for w, r in pipe.items():
        ok = r["pct_of_limit_per_worker"] >= 90
        results[f"efficiency_w{w}"] = ok
        print(f"target: per-worker efficiency >= 90% of the 1-thread limit, workers={w}: "
              f"{r['pct_of_limit_per_worker']:.1f}% {'PASS' if ok else 'FAIL'} "
              f"({r['pct_of_w_core_limit']:.1f}% of the {w}-core limit)")
    if 1 in pipe and 2 in pipe:
        speedup = float(np.median([a / b for a, b in zip(pipe[1]["all_seconds"],
                                                          pipe[2]["all_seconds"], strict=True)]))
        results["speedup_1_to_2"] = speedup >= 1.8
        print(f"target: speedup 1 -> 2 workers >= 1.8x: {speedup:.2f}x "
              f"{'PASS' if speedup >= 1.8 else 'FAIL'} (presumes 2 otherwise idle cores; "
              f"this machine has os.cpu_count() = {os.cpu_count()})")
    if args.json:
        print(json.dumps({"corpus": stats, "rows": rows, "targets": results,
                          "problems": problems, "cpu_count": os.cpu_count()}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
