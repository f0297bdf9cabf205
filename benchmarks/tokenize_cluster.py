"""``dataprep tokenize`` beyond one process pool: Ray (a 2-node cluster and "local") and the
SLURM way (``--shard K/N`` + ``dataprep merge``) against the local 2-worker run, on this
machine; what a chunk costs each engine, and what the splice can sustain.

On the ``benchmarks.tokenize`` corpus (default ~100 MB of jsonl, built and cached by
``harness.text_corpus``) with its 50,257-entry byte-level BPE ``tokenizer.json`` (trained and
cached the same way), every round runs, in this order:

  (a) the tokenizer's 2-process limit: ``tokenize_contestants.ConcurrentLimit`` (the
      library's ``encode_batch_fast`` + ``.ids`` in 2 processes over the texts in memory, in
      the batches the 2-worker pipeline's chunks make);
  (1) the baseline: ``tokenize_corpus(workers=2)``, the local process pool, in this process;
  (2) ``tokenize_corpus(ray_address=HEAD:PORT)`` on a 2-node Ray cluster started before the
      rounds (``ray start`` of a head and a worker node on the loopback addresses 127.0.0.2
      and 127.0.0.3, 1 CPU each, token authentication from the environment, as
      ``packages/dataprep/tests/test_ray_tokenize.py`` does); its start-up is timed once and
      reported apart;
  (3) ``tokenize_corpus(ray_address="local", workers=2)``: a Ray instance started in the call;
  (4) the SLURM way: ``dataprep tokenize --shard k/2 --workers 1`` for k = 0, 1 as two
      processes at once, then ``dataprep merge`` of the two parts (both the real command line
      in a fresh interpreter, as SLURM array tasks run them), the merge timed apart;
  (5) per-chunk overhead, on the first ``--overhead-mb`` (4) MB of the corpus: the local pool
      and the Ray cluster, each with the default chunk size (a dozen chunks) and with chunks
      of size / ``--overhead-chunks`` (~1,000 chunks; Ray: ``--ray-overhead-chunks``, ~250).
      Overhead per chunk = (time with many chunks - time with few) / (many - few), in wall
      time (what the job waits, 2 workers sharing it) and in CPU time (every process of the
      benchmark, Ray's daemons included; and the driver alone); beside it, the time to
      unpickle the Tokenizer (it loads its file again), which is why ``ray_tasks`` ships the
      init args as bytes: Ray deserializes a task's arguments for every task;
  (6) the splice: the baseline's output cut back into the shards its chunks made (real shard
      sizes; cutting is not timed), then appended into a fresh output as the pipeline's
      driver does (``IndexedDatasetWriter.add_index`` per shard, the shard's files unlinked,
      ``finalize``); ``merge_indexed_datasets`` (``dataprep merge``) of the two SLURM parts;
      against the machine's plain rates on the same bytes: ``shutil.copyfile`` of the
      output's ``.bin``, a sequential read of the corpus from the page cache and with
      O_DIRECT (the disk), and a write + fsync of the ``.bin``'s size.

The Ray and pool runs are timed inside ``tokenize_corpus`` too, by wrapping (in this process
only) ``ray.init``/``ray.shutdown`` (the connect and start-up / the tear-down of a run) and
``IndexedDatasetWriter.add_index``/``finalize`` (the driver's splice).

Every variant's output must be byte-identical to the baseline's (asserted; also the tiny-chunk
runs against the few-chunk run, and the re-spliced shards against the baseline).

CPU and other load: the benchmark's processes are those that carry a marker variable in their
environment (this process's children, the Ray daemons and their workers), read from /proc
every 0.1 s (Ray's raylets do not collect their workers' CPU time when those exit); "other"
is the cores every other process of the machine kept busy meanwhile, as in
``benchmarks.tokenize``. Each ratio is taken within a round and the median over rounds is
reported (default 3 rounds). The pipeline rows also show load-adjusted times, wall x (cores -
other) / cores, and their ratios use those: on a shared machine the load of other processes
changes between rows of one round and moves wall-time ratios
(``benchmarks/results/tokenize_cluster.md`` has by how much). Ray's worker processes run at nice 15
(Ray's default), so they yield to other load first.

The cluster: a ``ray stop`` anywhere on the machine (e.g. ``test_ray_tokenize.py``'s
teardown) ends every Ray process, this cluster's too. It is checked and started again before
each row that uses it, and if it dies during such a row the benchmark ends its processes and
exits with status 3 (the driver would otherwise hang in Ray's reconnect loop). It never runs
``ray stop`` itself: it ends its own cluster's processes by id.

At the end it prints derived figures for the multi-node design: Ray's overhead against the
local pool, the per-chunk costs, the output bytes per byte of text, and the splice rate
against what one 64-core node and 100 such nodes would need, assuming their cores tokenize at
this machine's measured per-core rate.

Run: ``make bench-tokenize-cluster`` or ``python -m benchmarks.tokenize_cluster
[--size-mb 20 --repeats 1]``. Needs Ray (``pip install 'bloomline-dataprep[ray]'``; in the
dev requirements). Writes ``benchmarks/results/bench_tokenize_cluster.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import pickle
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.machine import OtherLoad, load_average
from benchmarks.harness.paths import CACHE_DIR
from benchmarks.harness.text_corpus import byte_bpe_tokenizer, jsonl_corpus
from benchmarks.harness.tokenize_contestants import ConcurrentLimit, same_files
from benchmarks.tokenize_cluster_ray import MARK, Cluster, MarkedProcesses, Probes, install_probes
from benchmarks.tokenize_cluster_report import report
from benchmarks.tokenize_cluster_steps import (
    WORKERS,
    Runner,
    Series,
    chunk_batches,
    count_chunks,
    cut_into_shards,
    head_of_corpus,
    output_bytes,
    read_cached,
    read_direct,
    run_slurm,
    splice,
    write_fsync,
)
from bloomline.dataprep.indexed_dataset import IndexedDataset, merge_indexed_datasets
from bloomline.dataprep.sources import DEFAULT_CHUNK_BYTES
from bloomline.dataprep.tokenize_corpus import tokenize_corpus
from bloomline.dataprep.tokenizer import load_tokenizer

__all__ = ["main", "measure", "report"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--bpe-vocab-size", type=int, default=50257)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--overhead-mb", type=float, default=4,
                        help="size of the corpus head of the per-chunk runs")
    parser.add_argument("--overhead-chunks", type=int, default=1000,
                        help="about how many chunks the local pool's tiny-chunk run cuts it into")
    parser.add_argument("--ray-overhead-chunks", type=int, default=250,
                        help="the same for the Ray cluster (fewer: a Ray chunk costs more)")
    parser.add_argument("--node-cores", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--out", default="benchmarks/results/bench_tokenize_cluster.txt",
                        help="result file, relative to the repository ('' : none)")
    return parser.parse_args(argv)


@dataclass
class Setup:
    """The inputs, outputs and machinery every round uses."""

    corpus: Path
    folder: Path
    small: Path  # the corpus head of the per-chunk runs
    tiny: dict  # engine -> (chunk bytes, chunks) of its many-chunk run
    work: Path
    runner: Runner
    cluster: Cluster
    probes: Probes
    limit: ConcurrentLimit | None = None
    counts: list = field(default_factory=list)  # documents per chunk of the 2-worker run
    shard_sizes: list = field(default_factory=list)

    def path(self, name: str) -> Path:
        return self.work / name

    def pipeline(self, output: Path, source: Path | None = None, **kw):
        def run():
            summary = tokenize_corpus([str(source or self.corpus)], str(self.folder),
                                      str(output), workers=WORKERS, show_progress=False, **kw)
            return summary.num_tokens["text"]
        return run


def _engines(s: Setup) -> None:
    """(a) the limit, (1) the pool, (2) the Ray cluster, (3) Ray local, (4) the SLURM way."""
    S, runner, probes, cluster = s.runner.series, s.runner, s.probes, s.cluster  # noqa: N806
    base, ray_out, local_out, merged = map(s.path, ("base", "ray", "ray_local", "merged"))
    parts = [s.path(f"part{k}") for k in range(WORKERS)]
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as the limit's processes run
    limit_cpu = s.limit.cpu_seconds()
    S.setdefault("limit", Series()).tokens = runner.measure("limit", s.limit)
    S["limit"].add_extra("own_count", s.limit.cpu_seconds() - limit_cpu)
    os.environ.pop("TOKENIZERS_PARALLELISM", None)

    S.setdefault("base", Series()).tokens = runner.measure("base", s.pipeline(base), (base,))
    S["base"].add_extra("splice", probes.splice)

    cluster.ensure()
    with cluster.watched():
        S.setdefault("ray", Series()).tokens = runner.measure(
            "ray", s.pipeline(ray_out, ray_address=cluster.address), (ray_out,))
    S["ray"].add_extra("start", probes.ray_init + probes.ray_shutdown)
    S["ray"].add_extra("splice", probes.splice)
    assert same_files(base, ray_out), "Ray cluster output differs from the baseline's"

    S.setdefault("ray_local", Series()).tokens = runner.measure(
        "ray_local", s.pipeline(local_out, ray_address="local"), (local_out,))
    S["ray_local"].add_extra("start", probes.ray_init + probes.ray_shutdown)
    S["ray_local"].add_extra("init", probes.ray_init)
    S["ray_local"].add_extra("splice", probes.splice)
    assert same_files(base, local_out), "Ray local output differs from the baseline's"

    parts_wall, own, merge_s = runner.measure(
        "slurm", lambda: run_slurm(s.corpus, s.folder, parts, merged), (*parts, merged))
    S["slurm"].add_extra("parts", parts_wall)
    S["slurm"].add_extra("start", parts_wall - own)
    S["slurm"].add_extra("merge", merge_s)
    S["slurm"].tokens = IndexedDataset(merged).num_tokens
    assert same_files(base, merged), "--shard parts + merge differ from the baseline"


def _per_chunk(s: Setup) -> None:
    """(5) per-chunk overhead on the corpus head, and unpickling the Tokenizer."""
    S, cluster = s.runner.series, s.cluster  # noqa: N806
    for engine in ("pool", "raychunks"):
        for label, size in (("few", DEFAULT_CHUNK_BYTES), ("many", s.tiny[engine][0])):
            out = s.path(f"small_{engine}_{label}")
            kw = {}
            if engine != "pool":
                cluster.ensure()
                kw["ray_address"] = cluster.address
            with cluster.watched():
                s.runner.measure(f"{engine}_{label}",
                                 s.pipeline(out, s.small, max_chunk_bytes=size, **kw), (out,))
            S[f"{engine}_{label}"].add_extra("start", s.probes.ray_init + s.probes.ray_shutdown)
            assert same_files(s.path("small_pool_few"), out), f"{out.name} differs"
    # what a Ray task would pay if it got the init args deserialized (Ray does that per
    # task; the Tokenizer loads its file when unpickled, so ray_tasks ships them as
    # bytes and only a worker process new to the job unpickles them)
    pickled = pickle.dumps(load_tokenizer(s.folder))
    s.runner.measure("unpickle", lambda p=pickled: [pickle.loads(p) for _ in range(5)])


def _splice_and_disk(s: Setup) -> None:
    """(6) the splice of the baseline's shards, the merge, and the machine's plain rates."""
    S, runner, base = s.runner.series, s.runner, s.path("base")  # noqa: N806
    parts = [s.path(f"part{k}") for k in range(WORKERS)]
    shards = cut_into_shards(base, s.counts, s.path("shards"))
    s.shard_sizes = [output_bytes(shard) for shard in shards]
    times = runner.measure("splice", lambda: splice(
        shards, s.path("spliced"), IndexedDataset(base).dtype), (s.path("spliced"),))
    for key, value in zip(("copy", "unlink", "finalize"), times, strict=True):
        S["splice"].add_extra(key, value)
    assert same_files(base, s.path("spliced")), "the re-spliced shards differ"
    runner.measure("merge_fn", lambda: merge_indexed_datasets(
        [str(p) for p in parts], str(s.path("merged_fn"))), (s.path("merged_fn"),))
    assert same_files(base, s.path("merged_fn"))
    s.path("copy.bin").unlink(missing_ok=True)
    runner.measure("copyfile", lambda: shutil.copyfile(f"{base}.bin", s.path("copy.bin")))
    runner.measure("read_cached", lambda: read_cached(s.corpus))
    runner.measure("read_direct", lambda: read_direct(s.corpus))
    runner.measure("write_fsync", lambda: write_fsync(
        s.path("fsync.bin"), Path(f"{base}.bin").stat().st_size))


def _prepare(a: argparse.Namespace, marked: MarkedProcesses, ray) -> Setup:
    """The corpus, its tokenizer and head (cached), the chunk sizes, a fresh work folder."""
    cache: Path = a.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    corpus = jsonl_corpus(cache, a.size_mb)
    folder = byte_bpe_tokenizer(cache, corpus, a.size_mb, a.bpe_vocab_size)
    small = head_of_corpus(corpus, cache / f"bench_{a.size_mb:g}mb_head{a.overhead_mb:g}mb.jsonl",
                           a.overhead_mb)
    tiny = {}
    for engine, wanted in (("pool", a.overhead_chunks), ("raychunks", a.ray_overhead_chunks)):
        size = max(1, int(small.stat().st_size / wanted))
        tiny[engine] = (size, count_chunks(small, size))
    work = cache / "cluster"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    probes = Probes()
    install_probes(probes, ray)
    return Setup(corpus=corpus, folder=folder, small=small, tiny=tiny, work=work,
                 runner=Runner(marked, probes), cluster=Cluster(marked), probes=probes)


def measure(a: argparse.Namespace) -> dict:
    """Every round of every variant (``Runner.series``) and what the report derives from:
    the corpus's statistics, the cluster's start-up and idle load, the chunk counts, the
    output's sizes. The work folder is deleted before returning."""
    started = time.perf_counter()
    load_before = load_average("before")
    # Before Ray is imported: every Ray process of this run (the cluster, "local" instances,
    # their workers) and this driver share a token of this run's own (nothing read from or
    # written to ~/.ray), and carry the marker by which their CPU time is counted as ours.
    mark = secrets.token_hex(8)
    os.environ.update({MARK: mark, "RAY_AUTH_MODE": "token",
                       "RAY_AUTH_TOKEN": secrets.token_hex(32),
                       "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"})
    os.environ.pop("TOKENIZERS_PARALLELISM", None)
    import ray  # only after the environment above is set: Ray reads it when imported

    marked = MarkedProcesses(mark)
    s = _prepare(a, marked, ray)
    batches, s.counts, stats = chunk_batches(s.corpus, WORKERS)
    print("starting the 2-node Ray cluster ...", flush=True)
    round_other: list[float] = []
    try:
        head_s, worker_s = s.cluster.start()
        idle_cpu = marked.cpu_seconds()
        time.sleep(3)
        cluster_idle = (marked.cpu_seconds() - idle_cpu) / 3
        s.limit = ConcurrentLimit(s.folder, "library", batches, WORKERS)
        for round_no in range(1, a.repeats + 1):
            print(f"round {round_no}/{a.repeats}", flush=True)
            round_load = OtherLoad(marked.live_seconds).start()
            _engines(s)
            _per_chunk(s)
            _splice_and_disk(s)
            round_other.append(round_load.cores())
            print(f"round {round_no}/{a.repeats}: other processes kept {round_other[-1]:.2f} "
                  "cores busy", flush=True)
    finally:
        if s.limit is not None:
            s.limit.close()
        s.cluster.stop()
        marked.close()
    base = s.path("base")
    measured = {
        "args": a, "S": s.runner.series, "stats": stats, "corpus": s.corpus,
        "folder": s.folder, "small": s.small, "small_bytes": s.small.stat().st_size,
        "few_chunks": count_chunks(s.small, DEFAULT_CHUNK_BYTES), "tiny": s.tiny,
        "counts": s.counts, "shard_sizes": s.shard_sizes, "round_other": round_other,
        "head_s": head_s, "worker_s": worker_s, "cluster_idle": cluster_idle,
        "restarts": s.cluster.restarts, "niced": dict(marked.niced),
        "jsonl_bytes": s.corpus.stat().st_size, "out_bytes": output_bytes(base),
        "bin_bytes": Path(f"{base}.bin").stat().st_size,
        "itemsize": IndexedDataset(base).dtype.itemsize, "started": started,
        "load_before": load_before}
    shutil.rmtree(s.work, ignore_errors=True)
    return measured


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
