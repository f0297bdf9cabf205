"""``dataprep tokenize`` beyond one process pool: Ray (a 2-node cluster and "local") and the
SLURM way (``--shard K/N`` + ``dataprep merge``) against the local 2-worker run, on this
machine; what a chunk costs each engine, and what the splice can sustain.

On the ``bench_tokenize.py`` corpus (default ~100 MB of jsonl, built and cached by
``tokenize_contestants.build_corpus``) with its 50,257-entry byte-level BPE ``tokenizer.json``
(trained and cached as ``bench_tokenize.py`` does), every round runs, in this order:

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
``bench_tokenize.py``. Each ratio is taken within a round and the median over rounds is
reported (default 3 rounds). The pipeline rows also show load-adjusted times, wall x (cores -
other) / cores, and their ratios use those: on this shared 2-core machine other processes
took from 0 to 1.5 cores between rows of one round, which moved wall-time ratios by 50%.
Ray's worker processes run at nice 15 (Ray's default), so they yield to other load first.

The cluster: a ``ray stop`` anywhere on the machine (e.g. ``test_ray_tokenize.py``'s
teardown) ends every Ray process, this cluster's too. It is checked and started again before
each row that uses it, and if it dies during such a row the benchmark ends its processes and
exits with status 3 (the driver would otherwise hang in Ray's reconnect loop). It never runs
``ray stop`` itself: it ends its own cluster's processes by id.

At the end it prints derived figures for the multi-node design: Ray's overhead against the
local pool, the per-chunk costs, the output bytes per byte of text, and the splice rate
against what one 64-core node and 100 such nodes would need, assuming their cores tokenize at
this machine's measured per-core rate.

Run: ``make bench-tokenize-cluster`` or ``.venv/bin/python benchmarks/bench_tokenize_cluster.py
[--size-mb 20 --repeats 1]``. Needs Ray (``pip install 'bloomline-dataprep[ray]'``; in the
dev requirements). Writes ``benchmarks/results/bench_tokenize_cluster.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import pickle
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from machine import REPO, OtherLoad, header_line, load_average, relative  # noqa: E402
from tokenize_contestants import ConcurrentLimit, build_corpus, same_files  # noqa: E402

from bloomline.dataprep.indexed_dataset import (  # noqa: E402
    IndexedDataset,
    IndexedDatasetWriter,
    merge_indexed_datasets,
)
from bloomline.dataprep.pipeline import tokenize_corpus  # noqa: E402
from bloomline.dataprep.sources import (  # noqa: E402
    DEFAULT_CHUNK_BYTES,
    expand_inputs,
    iter_chunks,
    read_line_range,
)
from bloomline.dataprep.tokenizer import load_tokenizer, train_tokenizer  # noqa: E402

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
MARK = "BLOOMLINE_BENCH_CLUSTER"  # the environment variable that marks our processes
CLK = os.sysconf("SC_CLK_TCK")
WORKERS = 2


# ----------------------------------------------------------------------- our processes


class MarkedProcesses:
    """CPU seconds of every process whose environment carries ``MARK=<token>`` (ours: spawned
    children, Ray's daemons and their workers), this process excepted, dead ones included.

    Ray's raylets do not collect their workers' CPU time when those exit (no ``cutime``), so
    a background thread reads ``/proc`` every ``interval`` seconds and keeps each process's
    last utime + stime: a process that ends is counted up to its last sample (at most
    ``interval`` of its CPU is lost). Reaped children's ``cutime`` is not used (no double
    count).
    """

    def __init__(self, token: str, interval: float = 0.1) -> None:
        self.needle = f"{MARK}={token}".encode()
        self.known: dict[tuple[str, bytes], bool] = {}
        self.last: dict[tuple[str, bytes], int] = {}  # (pid, start time) -> clock ticks
        self.niced: dict[str, int] = {}  # command -> nice value, of those not at 0
        self.overhead = 0.0  # CPU seconds this process spent scanning /proc
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self.thread.start()

    def _run(self, interval: float) -> None:
        while not self.stopped.wait(interval):
            self._scan()

    def _scan(self) -> list[tuple[int, list[bytes]]]:
        found, me = [], os.getpid()
        with self.lock:
            start = time.thread_time()
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == me:
                    continue
                try:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        fields = fh.read().rsplit(b")", 1)[1].split()
                    key = (name, fields[19])  # pid and start time: a reused pid is another
                    marked = self.known.get(key)
                    if marked is None:
                        with open(f"/proc/{name}/environ", "rb") as fh:
                            marked = self.needle in fh.read().split(b"\0")
                        self.known[key] = marked
                        if marked and int(fields[16]) != 0:  # nice
                            with open(f"/proc/{name}/cmdline", "rb") as fh:
                                command = fh.read().split(b"\0")[0].decode(errors="replace")
                            self.niced[Path(command).name[:40]] = int(fields[16])
                    if marked:
                        self.last[key] = int(fields[11]) + int(fields[12])  # utime + stime
                        found.append((int(name), fields))
                except (OSError, IndexError):
                    continue  # gone meanwhile, or a zombie
            self.overhead += time.thread_time() - start
        return found

    def cpu_seconds(self) -> float:
        self._scan()
        with self.lock:
            return sum(self.last.values()) / CLK

    def live_seconds(self) -> float:
        """For ``OtherLoad``, which adds this process's CPU and its reaped children's
        (``os.times``) itself: the other processes counted here, less those children (counted
        here already) and this process's own scanning."""
        t = os.times()
        return self.cpu_seconds() - (t.children_user + t.children_system) - self.overhead

    def driver_cpu(self) -> float:
        """This process's CPU seconds, its scanning excepted."""
        t = os.times()
        return t.user + t.system - self.overhead

    def pids(self, exclude_descendants_of: int | None = None) -> list[int]:
        """The live marked processes; without those descending from a process."""
        found = {pid: int(fields[1]) for pid, fields in self._scan()}  # pid -> parent
        if exclude_descendants_of is None:
            return list(found)

        def descends(pid: int) -> bool:
            seen = set()
            while pid > 1 and pid not in seen:
                seen.add(pid)
                if pid == exclude_descendants_of:
                    return True
                try:
                    with open(f"/proc/{pid}/stat", "rb") as fh:
                        pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    return False
            return False
        return [pid for pid in found if not descends(pid)]

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


# ------------------------------------------------------------------------------ corpus


def chunk_batches(corpus: Path, workers: int) -> tuple[list[list[str]], list[int], dict]:
    """The texts in memory, batched as the ``workers``-worker pipeline cuts the file into
    chunks (byte ranges: a line belongs to the range holding its first byte), the documents
    per chunk, and the corpus's statistics."""
    with open(corpus, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    counts = []
    for chunk in iter_chunks(expand_inputs([str(corpus)]), DEFAULT_CHUNK_BYTES, False, workers):
        if chunk.kind == "range":
            data, _ = read_line_range(chunk.source.path, chunk.start, chunk.stop)
        else:
            data = chunk.payload
        counts.append(data.count(b"\n"))
    assert sum(counts) == len(texts), "chunk line counts do not cover the corpus"
    bounds = np.concatenate([[0], np.cumsum(counts)])
    batches = [texts[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    sizes = [len(t.encode()) for t in texts]
    return batches, counts, {"documents": len(texts), "text_bytes": sum(sizes)}


def head_of_corpus(corpus: Path, path: Path, size_mb: float) -> Path:
    """The first whole lines of ``corpus`` up to ``size_mb`` MB (cached)."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        written = 0
        with open(corpus, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if written >= size_mb * 1e6:
                    break
                written += dst.write(line)
        os.replace(tmp, path)
    return path


def count_chunks(corpus: Path, max_bytes: int) -> int:
    return sum(1 for _ in iter_chunks(expand_inputs([str(corpus)]), max_bytes, False, WORKERS))


def output_bytes(prefix: Path) -> int:
    return sum(Path(f"{prefix}{s}").stat().st_size for s in (".bin", ".idx"))


# ------------------------------------------------------------------------- Ray cluster


def ray_cli(*args: str, env: dict) -> None:
    ray = Path(sys.executable).parent / "ray"
    done = subprocess.run([str(ray), *args], capture_output=True, text=True, timeout=180,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"ray {args[0]} failed:\n{done.stdout}\n{done.stderr}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """A head (127.0.0.2) and a worker node (127.0.0.3) of 1 CPU each, on this machine."""

    def __init__(self, marked: MarkedProcesses) -> None:
        self.marked = marked
        self.restarts = 0

    def start(self) -> tuple[float, float]:
        """(seconds to start the head, seconds to start the worker node and join)."""
        # Ray's unix sockets live under the temp dir: keep its path short (108-byte limit)
        self.temp = tempfile.mkdtemp(prefix="raybench", dir="/tmp")
        self.port = free_port()
        self.address = f"{HEAD}:{self.port}"
        start = time.perf_counter()
        ray_cli("start", "--head", "--node-ip-address", HEAD, "--port", str(self.port),
                "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                "--temp-dir", self.temp, env=dict(os.environ))
        head = time.perf_counter() - start
        ray_cli("start", "--address", self.address, "--node-ip-address", WORKER,
                "--num-cpus", "1", env=dict(os.environ))
        return head, time.perf_counter() - start - head

    def alive(self) -> bool:
        """Its GCS and both raylets run (``ray stop`` elsewhere on the machine, e.g. a test
        run's teardown, ends every Ray process, ours too)."""
        names = []
        for pid in self.marked.pids(exclude_descendants_of=os.getpid()):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        return names.count("gcs_server") >= 1 and names.count("raylet") >= 2

    def ensure(self) -> None:
        """Start the cluster again if something stopped it (counted in ``restarts``)."""
        if not self.alive():
            print("the Ray cluster was stopped from outside; starting it again", flush=True)
            self.stop()
            self.start()
            self.restarts += 1

    @contextlib.contextmanager
    def watched(self):
        """Abort the benchmark if the cluster dies while a timed run uses it: the driver
        would hang in Ray's reconnect loop (minutes) and the row would be meaningless."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(1.0):
                if not self.alive():
                    print("error: the Ray cluster was stopped from outside (`ray stop` of "
                          "another run?) during a timed run; rerun the benchmark",
                          file=sys.stderr, flush=True)
                    for pid in self.marked.pids():
                        with contextlib.suppress(OSError):
                            if b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                                continue  # multiprocessing's: it ends with this process
                            os.kill(pid, signal.SIGKILL)
                    shutil.rmtree(self.temp, ignore_errors=True)
                    os._exit(3)
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def stop(self) -> None:
        """End the cluster's processes by their ids (never ``ray stop``, which ends every
        Ray process of the machine, other people's too). Ours are the marked processes that
        do not descend from this one (``ray start`` detaches its daemons)."""
        me = os.getpid()
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            for pid in self.marked.pids(exclude_descendants_of=me):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.marked.pids(me) and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp, ignore_errors=True)


# ---------------------------------------------------------------------------- probes


@dataclass
class Probes:
    """Seconds spent in wrapped calls of this process since the last reset."""

    splice: float = 0.0  # IndexedDatasetWriter.add_index + finalize
    ray_init: float = 0.0
    ray_shutdown: float = 0.0
    spliced_bytes: int = 0

    def reset(self) -> None:
        self.splice = self.ray_init = self.ray_shutdown = 0.0
        self.spliced_bytes = 0


def install_probes(probes: Probes, ray) -> None:
    add_index, finalize = IndexedDatasetWriter.add_index, IndexedDatasetWriter.finalize
    init, shutdown = ray.init, ray.shutdown

    def timed(fn, attr: str):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(probes, attr, getattr(probes, attr) + time.perf_counter() - start)
        return wrapper

    def add_index_counted(self, path_prefix):
        probes.spliced_bytes += Path(f"{path_prefix}.bin").stat().st_size
        return add_index(self, path_prefix)

    IndexedDatasetWriter.add_index = timed(add_index_counted, "splice")
    IndexedDatasetWriter.finalize = timed(finalize, "splice")
    ray.init = timed(init, "ray_init")  # ray_tasks calls ray.init / ray.shutdown by attribute
    ray.shutdown = timed(shutdown, "ray_shutdown")


# ----------------------------------------------------------------------------- rounds


@dataclass
class Series:
    """One measurement's values per round."""

    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # all our processes
    driver_cpu: list[float] = field(default_factory=list)  # this process alone
    other: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    tokens: int = 0

    def add_extra(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)


def med(values) -> float:
    return float(np.median(values))


class Runner:
    def __init__(self, marked: MarkedProcesses, probes: Probes) -> None:
        self.marked, self.probes = marked, probes
        self.series: dict[str, Series] = {}

    def measure(self, name: str, fn, outputs: tuple[Path, ...] = ()) -> object:
        """Run ``fn`` once, timed, after deleting ``outputs`` (untimed); returns what it
        returns."""
        print(f"  {name} ...", flush=True)
        remove_outputs(*outputs)
        series = self.series.setdefault(name, Series())
        self.probes.reset()
        load = OtherLoad(self.marked.live_seconds).start()
        driver = self.marked.driver_cpu()
        start = time.perf_counter()
        result = fn()
        series.seconds.append(time.perf_counter() - start)
        series.driver_cpu.append(self.marked.driver_cpu() - driver)
        series.cpu.append(load.own_cpu())
        series.other.append(load.cores())
        return result


def run_slurm(corpus: Path, folder: Path, parts: list[Path], merged: Path
              ) -> tuple[float, float, float]:
    """Two ``--shard k/2`` processes at once, then ``dataprep merge``: (parts' wall seconds,
    the slower part's own seconds, the merge's wall seconds)."""
    cli = [sys.executable, "-m", "bloomline.dataprep.cli"]
    env = dict(os.environ)
    env.pop("TOKENIZERS_PARALLELISM", None)
    start = time.perf_counter()
    procs = [subprocess.Popen([*cli, "tokenize", str(corpus), "--tokenizer", str(folder),
                               "--output", str(part), "--workers", "1", "--shard",
                               f"{k}/{len(parts)}", "--quiet", "--overwrite"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for k, part in enumerate(parts)]
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"tokenize --shard failed:\n{err.decode()[-2000:]}")
    parts_wall = time.perf_counter() - start
    own = max(json.loads(Path(f"{p}.shard.json").read_text())["seconds"] for p in parts)
    start = time.perf_counter()
    done = subprocess.run([*cli, "merge", *map(str, parts), "--output", str(merged),
                           "--overwrite"], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"dataprep merge failed:\n{done.stderr[-2000:]}")
    return parts_wall, own, time.perf_counter() - start


def cut_into_shards(prefix: Path, counts: list[int], folder: Path) -> list[Path]:
    """The output ``prefix`` cut back into one shard per chunk (``counts`` documents each),
    as the pipeline's workers wrote them."""
    ds = IndexedDataset(prefix)
    seqs_per_doc = np.diff(ds.document_indices)
    doc_lengths = np.zeros(len(seqs_per_doc), np.int64)
    doc_lengths[seqs_per_doc == 1] = ds.sequence_lengths
    assert seqs_per_doc.max() <= 1 and doc_lengths.sum() == ds.num_tokens
    tokens = np.memmap(f"{prefix}.bin", ds.dtype, "r")
    folder.mkdir(parents=True, exist_ok=True)
    shards, doc, tok = [], 0, 0
    for index, count in enumerate(counts):
        lengths = doc_lengths[doc : doc + count]
        n = int(lengths.sum())
        shard = folder / f"chunk{index:08d}_text"
        with IndexedDatasetWriter(shard, ds.dtype, overwrite=True) as writer:
            writer.add_documents(np.asarray(tokens[tok : tok + n]), lengths)
        shards.append(shard)
        doc, tok = doc + count, tok + n
    return shards


def splice(shards: list[Path], output: Path, dtype) -> tuple[float, float, float]:
    """What the pipeline's driver does with finished shards, in chunk order: (seconds in
    add_index, in unlinking the shards, in finalize)."""
    copy = unlink = 0.0
    writer = IndexedDatasetWriter(output, dtype)
    for shard in shards:
        t0 = time.perf_counter()
        writer.add_index(shard)
        t1 = time.perf_counter()
        for suffix in (".bin", ".idx"):
            Path(f"{shard}{suffix}").unlink()
        t2 = time.perf_counter()
        copy, unlink = copy + t1 - t0, unlink + t2 - t1
    writer.finalize()
    return copy, unlink, time.perf_counter() - t2


def remove_outputs(*prefixes: Path) -> None:
    """Delete earlier outputs before a run, untimed (replacing a file frees its blocks, which
    costs ~1 ms per MB-sized file on this disk, mounted with ``discard``)."""
    for prefix in prefixes:
        for suffix in (".bin", ".idx", ".fingerprint.json", ".shard.json"):
            Path(f"{prefix}{suffix}").unlink(missing_ok=True)


def read_cached(path: Path) -> int:
    buf = bytearray(16 << 20)
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            total += n
    return total


def read_direct(path: Path) -> int:
    """Sequential read with O_DIRECT (past the page cache: the disk)."""
    buf = mmap.mmap(-1, 16 << 20)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    total = 0
    try:
        while n := os.preadv(fd, [buf], total):
            total += n
    finally:
        os.close(fd)
        buf.close()
    return total


def write_fsync(path: Path, nbytes: int) -> None:
    block = os.urandom(16 << 20)
    with open(path, "wb", buffering=0) as fh:
        left = nbytes
        while left > 0:
            left -= fh.write(block[: min(left, len(block))])
        os.fsync(fh.fileno())
    path.unlink()


# ----------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100)
    parser.add_argument("--cache-dir", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("--bpe-vocab-size", type=int, default=50257)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--overhead-mb", type=float, default=4,
                        help="size of the corpus head of the per-chunk runs")
    parser.add_argument("--overhead-chunks", type=int, default=1000,
                        help="about how many chunks the local pool's tiny-chunk run cuts it into")
    parser.add_argument("--ray-overhead-chunks", type=int, default=250,
                        help="the same for the Ray cluster (~0.1 s per chunk: fewer)")
    parser.add_argument("--node-cores", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--out", default="benchmarks/results/bench_tokenize_cluster.txt",
                        help="result file, relative to the repository ('' : none)")
    a = parser.parse_args()
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
    import ray

    cache: Path = a.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    corpus = cache / f"bench_{a.size_mb:g}mb.jsonl"
    if not corpus.exists():
        print(f"generating {corpus.name} ...", flush=True)
        build_corpus(corpus, a.size_mb)
    folder = cache / f"bench_{a.size_mb:g}mb_bytebpe{a.bpe_vocab_size}"
    if not (folder / "tokenizer.json").exists():
        print(f"training a {a.bpe_vocab_size}-entry byte-level BPE on it ...", flush=True)
        train_tokenizer([str(corpus)], folder, a.bpe_vocab_size, kind="byte-bpe",
                        max_sentences=300_000, overwrite=True)
    small = head_of_corpus(corpus, cache / f"bench_{a.size_mb:g}mb_head{a.overhead_mb:g}mb.jsonl",
                           a.overhead_mb)
    few_chunks = count_chunks(small, DEFAULT_CHUNK_BYTES)
    tiny = {}  # engine -> (chunk bytes, chunks) of its many-chunk run
    for engine, wanted in (("pool", a.overhead_chunks), ("raychunks", a.ray_overhead_chunks)):
        size = max(1, int(small.stat().st_size / wanted))
        tiny[engine] = (size, count_chunks(small, size))
    work = cache / "cluster"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()

    batches, counts, stats = chunk_batches(corpus, WORKERS)
    text_bytes, jsonl_bytes = stats["text_bytes"], corpus.stat().st_size
    marked = MarkedProcesses(mark)
    probes = Probes()
    install_probes(probes, ray)
    runner = Runner(marked, probes)
    S = runner.series  # noqa: N806

    print("starting the 2-node Ray cluster ...", flush=True)
    cluster = Cluster(marked)
    limit = None
    round_other: list[float] = []
    try:
        head_s, worker_s = cluster.start()
        idle_cpu = marked.cpu_seconds()
        time.sleep(3)
        cluster_idle = (marked.cpu_seconds() - idle_cpu) / 3
        limit = ConcurrentLimit(folder, "library", batches, WORKERS)

        base, ray_out, local_out, merged = (work / n for n in ("base", "ray", "ray_local",
                                                                "merged"))
        parts = [work / f"part{k}" for k in range(WORKERS)]

        def pipeline(output: Path, source: Path = corpus, **kw):
            def run():
                summary = tokenize_corpus([str(source)], str(folder), str(output),
                                          workers=WORKERS, show_progress=False, **kw)
                return summary.num_tokens["text"]
            return run

        for round_no in range(1, a.repeats + 1):
            print(f"round {round_no}/{a.repeats}", flush=True)
            round_load = OtherLoad(marked.live_seconds).start()
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as the limit's processes run
            limit_cpu = limit.cpu_seconds()
            S.setdefault("limit", Series()).tokens = runner.measure("limit", limit)
            S["limit"].add_extra("own_count", limit.cpu_seconds() - limit_cpu)
            os.environ.pop("TOKENIZERS_PARALLELISM", None)

            S.setdefault("base", Series()).tokens = runner.measure("base", pipeline(base), (base,))
            S["base"].add_extra("splice", probes.splice)

            cluster.ensure()
            with cluster.watched():
                S.setdefault("ray", Series()).tokens = runner.measure(
                    "ray", pipeline(ray_out, ray_address=cluster.address), (ray_out,))
            S["ray"].add_extra("start", probes.ray_init + probes.ray_shutdown)
            S["ray"].add_extra("splice", probes.splice)
            assert same_files(base, ray_out), "Ray cluster output differs from the baseline's"

            S.setdefault("ray_local", Series()).tokens = runner.measure(
                "ray_local", pipeline(local_out, ray_address="local"), (local_out,))
            S["ray_local"].add_extra("start", probes.ray_init + probes.ray_shutdown)
            S["ray_local"].add_extra("init", probes.ray_init)
            S["ray_local"].add_extra("splice", probes.splice)
            assert same_files(base, local_out), "Ray local output differs from the baseline's"

            parts_wall, own, merge_s = runner.measure(
                "slurm", lambda: run_slurm(corpus, folder, parts, merged), (*parts, merged))
            S["slurm"].add_extra("parts", parts_wall)
            S["slurm"].add_extra("start", parts_wall - own)
            S["slurm"].add_extra("merge", merge_s)
            S["slurm"].tokens = IndexedDataset(merged).num_tokens
            assert same_files(base, merged), "--shard parts + merge differ from the baseline"

            # (5) per-chunk overhead on the corpus head
            for engine in ("pool", "raychunks"):
                for label, size in (("few", DEFAULT_CHUNK_BYTES), ("many", tiny[engine][0])):
                    out = work / f"small_{engine}_{label}"
                    kw = {}
                    if engine != "pool":
                        cluster.ensure()
                        kw["ray_address"] = cluster.address
                    with cluster.watched():
                        runner.measure(f"{engine}_{label}",
                                       pipeline(out, small, max_chunk_bytes=size, **kw), (out,))
                    S[f"{engine}_{label}"].add_extra("start", probes.ray_init
                                                     + probes.ray_shutdown)
                    assert same_files(work / "small_pool_few", out), f"{out.name} differs"

            # what a Ray task would pay if it got the init args deserialized (Ray does that per
            # task; the Tokenizer loads its file when unpickled, so ray_tasks ships them as
            # bytes and only a worker process new to the job unpickles them)
            pickled = pickle.dumps(load_tokenizer(folder))
            runner.measure("unpickle", lambda p=pickled: [pickle.loads(p) for _ in range(5)])

            # (6) the splice and the machine's plain rates
            shards = cut_into_shards(base, counts, work / "shards")
            shard_sizes = [output_bytes(shard) for shard in shards]
            times = runner.measure("splice", lambda shards=shards: splice(
                shards, work / "spliced", IndexedDataset(base).dtype), (work / "spliced",))
            for key, value in zip(("copy", "unlink", "finalize"), times, strict=True):
                S["splice"].add_extra(key, value)
            assert same_files(base, work / "spliced"), "the re-spliced shards differ"
            runner.measure("merge_fn", lambda: merge_indexed_datasets(
                [str(p) for p in parts], str(work / "merged_fn")), (work / "merged_fn",))
            assert same_files(base, work / "merged_fn")
            (work / "copy.bin").unlink(missing_ok=True)
            runner.measure("copyfile", lambda: shutil.copyfile(f"{base}.bin",
                                                               work / "copy.bin"))
            runner.measure("read_cached", lambda: read_cached(corpus))
            runner.measure("read_direct", lambda: read_direct(corpus))
            runner.measure("write_fsync", lambda: write_fsync(
                work / "fsync.bin", Path(f"{base}.bin").stat().st_size))
            round_other.append(round_load.cores())
            print(f"round {round_no}/{a.repeats}: other processes kept {round_other[-1]:.2f} "
                  "cores busy", flush=True)
    finally:
        if limit is not None:
            limit.close()
        cluster.stop()
        marked.close()

    # ------------------------------------------------------------------- the report
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line)
        lines.append(line)

    out_bytes = output_bytes(base)
    bin_bytes = Path(f"{base}.bin").stat().st_size
    base_tokens = S["base"].tokens

    def ratio(num: str, den: str, what: str = "seconds") -> float:
        return med([x / y for x, y in zip(getattr(S[num], what), getattr(S[den], what),
                                          strict=True)])

    out(f"corpus {corpus.name} (in {relative(cache)}): {stats['documents']:,} "
        f"documents, {jsonl_bytes / 1e6:.1f} MB jsonl, {text_bytes / 1e6:.1f} MB of text; "
        f"tokenizer {folder.name}/tokenizer.json; {len(counts)} chunks at --workers 2 "
        f"(default --chunk-mb {DEFAULT_CHUNK_BYTES / 2**20:g}); {a.repeats} rounds")
    out("other processes kept " + ", ".join(f"{c:.2f}" for c in round_other)
        + " cores busy in rounds " + ", ".join(map(str, range(1, a.repeats + 1)))
        + (" (WARNING: shared machine, timings noisy)" if max(round_other) > 0.25 else ""))
    out(f"Ray {version('ray')} cluster: head {HEAD} + worker {WORKER}, 1 CPU each, token auth; "
        f"start-up (before timing): head {head_s:.1f} s + worker node {worker_s:.1f} s; its "
        f"daemons idle: {cluster_idle:.3f} cores (counted as ours in every row)"
        + (f"; restarted {cluster.restarts} time(s) between rows after something else stopped "
           "it" if cluster.restarts else ""))
    niced = ", ".join(f"{cmd} at nice {nice}" for cmd, nice in sorted(marked.niced.items()))
    out(f"processes of this benchmark that ran niced (the rest at nice 0, the local pool's "
        f"workers too): {niced or 'none'}; a niced process yields the CPU to other processes "
        "first, which matters on a shared machine only")
    out()
    cores = os.cpu_count() or 1

    def adjusted(secs: list[float], other: list[float]) -> list[float]:
        """Seconds scaled to all cores free: time x (cores - other) / cores, per round."""
        return [x * max(cores - o, 0.1) / cores for x, o in zip(secs, other, strict=True)]

    header = (f"{'variant':<56} {'s':>6} {'adj s':>6} {'MB/s':>5} {'tokens/s':>10} "
              f"{'%2-lim':>6} {'vs base':>7} {'raw vs':>6} {'start s':>7} {'splice s':>8} "
              f"{'cpu s':>6}  seconds per round | other")
    out(header)
    out("-" * len(header))
    limit_adj = adjusted(S["limit"].seconds, S["limit"].other)
    base_adj = adjusted(S["base"].seconds, S["base"].other)

    def row(label: str, key: str, secs: list[float] | None = None, tokens: int | None = None,
            start: str | None = None, splice_key: str | None = "splice", full: bool = True,
            ratios: bool = True) -> None:
        s = S[key]
        secs = s.seconds if secs is None else secs
        adj = adjusted(secs, s.other)
        t, t_adj = med(secs), med(adj)
        tokens = s.tokens if tokens is None else tokens
        lim = med([x / y for x, y in zip(limit_adj, adj, strict=True)]) * 100
        vs = med([x / y for x, y in zip(base_adj, adj, strict=True)])
        raw = med([x / y for x, y in zip(S["base"].seconds, secs, strict=True)])
        st = s.extra.get(start) if start else None
        sp = s.extra.get(splice_key) if splice_key else None
        out(f"{label:<56} {t:>6.2f} {t_adj:>6.2f} {text_bytes / t_adj / 1e6:>5.2f} "
            + (f"{tokens / t_adj:>10,.0f} " if tokens else f"{'':>11}")
            + (f"{lim:>5.1f}% {vs:>6.2f}x {raw:>5.2f}x " if ratios else f"{'':>23}")
            + (f"{med(st):>7.2f} " if st else f"{'':>8}")
            + (f"{med(sp):>8.2f} " if sp else f"{'':>9}")
            + (f"{med(s.cpu):>6.1f}  " if full else f"{'':>8}")
            + " ".join(f"{x:.2f}" for x in secs)
            + (" | " + " ".join(f"{c:.2f}" for c in s.other) if full else ""))

    row("(a) encode_batch_fast + .ids, 2 processes = 2-core limit", "limit", splice_key=None)
    row("(1) tokenize_corpus, local pool, workers=2 = baseline", "base")
    row("(2) --ray HEAD:PORT, 2-node loopback cluster (1+1 CPU)", "ray", start="start")
    row('(3) --ray (local instance started per run, 2 CPUs)', "ray_local", start="start")
    row("(4) SLURM way: 2 x --shard k/2 --workers 1 + merge", "slurm", start="start",
        splice_key="merge")
    row("    of which the 2 parts, run at once", "slurm", secs=S["slurm"].extra["parts"],
        start="start", splice_key=None, full=False)
    row("    of which dataprep merge (its own process)", "slurm", secs=S["slurm"].extra["merge"],
        tokens=0, splice_key=None, full=False, ratios=False)
    out("s: median of rounds (wall); adj s: the same with each round's time x (cores - other) "
        "/ cores, the time had the cores been free (other processes took `other` of them; a "
        "first-order correction for this shared machine: it ignores the slowdown of sharing a "
        "core's caches); MB/s (text bytes) and tokens/s (the output's, with EOD; the limit's "
        "without) per adj s; %2-lim: the 2-process limit's adj s / adj s; vs base: the "
        "baseline's adj s / adj s; raw vs: the same with wall times; ratios are medians of "
        "per-round ratios. start s: ray.init + "
        "ray.shutdown inside the run (cluster: connect, the job's worker processes start on "
        "the first tasks; local: starting and stopping the instance); SLURM: the parts' wall "
        "- the slower part's own time (interpreter start, imports, shard plan). splice s: the "
        "driver's IndexedDatasetWriter.add_index + finalize inside the run; SLURM: the merge's "
        "wall time. cpu s: CPU seconds of all the benchmark's processes (Ray daemons and "
        "workers included). other: cores other processes kept busy during the row.")
    out(f"correctness: the outputs of (2), (3), (4), the tiny-chunk runs and the re-spliced "
        f"shards are byte-identical to the baseline's ({base_tokens:,} tokens, "
        f"{out_bytes / 1e6:.1f} MB .bin + .idx)")

    # per-chunk overhead
    out()
    out(f"per-chunk overhead: corpus head {small.name} ({small.stat().st_size / 1e6:.1f} MB), "
        f"{few_chunks} chunks (default size) vs, for the pool, {tiny['pool'][1]:,} chunks of "
        f"{tiny['pool'][0]:,} B (--chunk-mb {tiny['pool'][0] / 2**20:.4f}) and for Ray "
        f"{tiny['raychunks'][1]:,} chunks of {tiny['raychunks'][0]:,} B; workers=2")
    header = (f"{'engine':<34} {'chunks':>6} {'s':>6} {'cpu s':>6} {'driver cpu s':>12} "
              f"{'start s':>7} {'overhead/chunk: wall':>20} {'cpu':>8} {'driver':>8}  "
              "seconds per round | other")
    out(header)
    out("-" * len(header))
    per_chunk = {}
    for engine, label in (("pool", "local pool"), ("raychunks", "Ray 2-node cluster")):
        few, many = S[f"{engine}_few"], S[f"{engine}_many"]
        many_chunks = tiny[engine][1]
        n = many_chunks - few_chunks
        wall = med([(m - f) / n for m, f in zip(many.seconds, few.seconds, strict=True)])
        cpu = med([(m - f) / n for m, f in zip(many.cpu, few.cpu, strict=True)])
        drv = med([(m - f) / n for m, f in zip(many.driver_cpu, few.driver_cpu, strict=True)])
        per_chunk[engine] = (wall, cpu, drv)
        for s, chunks in ((few, few_chunks), (many, many_chunks)):
            st = s.extra.get("start", [0])
            out(f"{label + (' (few)' if s is few else ' (many)'):<34} {chunks:>6,} "
                f"{med(s.seconds):>6.2f} {med(s.cpu):>6.2f} {med(s.driver_cpu):>12.2f} "
                + (f"{med(st):>7.2f} " if engine != "pool" else f"{'':>8}")
                + (f"{wall * 1e6:>17,.0f} us {cpu * 1e6:>5,.0f} us {drv * 1e6:>5,.0f} us  "
                   if s is many else f"{'':>41}  ")
                + " ".join(f"{x:.2f}" for x in s.seconds) + " | "
                + " ".join(f"{c:.2f}" for c in s.other))
    unpickle = med(S["unpickle"].seconds) / 5
    out(f"unpickling the Tokenizer (it loads tokenizer.json again): {unpickle * 1e3:.1f} ms ("
        + " ".join(f"{x / 5 * 1e3:.1f}" for x in S["unpickle"].seconds) + " per round); Ray "
        "deserializes a task's arguments for every task, so ray_tasks ships the init args as "
        "pickled bytes and only a worker process new to the job unpickles them (before that, "
        "every task reloaded the tokenizer: ~120 ms per chunk on this machine)")
    out("overhead/chunk = (many-chunk run - few-chunk run) / (difference in chunks), medians "
        "of per-round values: wall (what the job waits for, 2 workers sharing the work), cpu "
        "(all the benchmark's processes: workers, driver, Ray daemons), driver (this process "
        "alone: submitting, collecting results, the splice).")

    # the splice and the machine's plain rates
    out()
    out(f"the splice and the machine: output {bin_bytes / 1e6:.1f} MB .bin + "
        f"{(out_bytes - bin_bytes) / 1e6:.2f} MB .idx from {len(counts)} shards (.bin + .idx "
        f"of {min(shard_sizes) / 1e6:.2f}-{max(shard_sizes) / 1e6:.2f} MB, median "
        f"{med(shard_sizes) / 1e6:.2f}); corpus {jsonl_bytes / 1e6:.1f} MB; all on one local "
        "disk (no shared filesystem on this machine)")
    header = (f"{'operation':<70} {'MB':>6} {'s':>6} {'MB/s':>7} {'ms/shard':>8}  "
              "seconds per round | other")
    out(header)
    out("-" * len(header))
    rates = {}
    n_shards = len(counts)
    sp = S["splice"].extra
    for key, label, nbytes, secs in (
            ("splice", f"splice loop: add_index of the {n_shards} shards + unlink + finalize",
             out_bytes, S["splice"].seconds),
            ("copy", "    of which add_index (copy_file_range + the index arrays)", out_bytes,
             sp["copy"]),
            ("unlink", "    of which unlinking each shard's .bin and .idx", None, sp["unlink"]),
            ("finalize", "    of which finalize (writes the .idx, renames)", None,
             sp["finalize"]),
            ("merge_fn", "merge_indexed_datasets of the 2 SLURM parts (dataprep merge, in "
             "process)", out_bytes, None),
            ("copyfile", "shutil.copyfile of the output's .bin (page cache)", bin_bytes, None),
            ("read_cached", "sequential read of the corpus, page cache", jsonl_bytes, None),
            ("read_direct", "sequential read of the corpus, O_DIRECT (the disk)", jsonl_bytes,
             None),
            ("write_fsync", "write + fsync of the .bin's size (the disk)", bin_bytes, None)):
        full = secs is None or key == "splice"
        secs = S[key].seconds if secs is None else secs
        per_shard = key in ("splice", "copy", "unlink")
        rates[key] = med([nbytes / x / 1e6 for x in secs]) if nbytes else 0.0
        out(f"{label:<70} " + (f"{nbytes / 1e6:>6.1f} " if nbytes else f"{'':>7}")
            + f"{med(secs):>6.3f} " + (f"{rates[key]:>7,.0f} " if nbytes else f"{'':>8}")
            + (f"{med(secs) / n_shards * 1e3:>8.2f}  " if per_shard else f"{'':>10}")
            + " ".join(f"{x:.3f}" for x in secs)
            + (" | " + " ".join(f"{c:.2f}" for c in S[key].other) if full else ""))
    out("MB/s: median over rounds of bytes / seconds (splice and merge: .bin + .idx written); "
        "the shards are cut from the baseline's output at its chunks' document boundaries and "
        "written (untimed) just before, so they are in the page cache as a worker leaves them.")

    # derived figures
    out()
    base_t = med(S["base"].seconds)
    out_per_text = out_bytes / text_bytes
    jsonl_per_text = jsonl_bytes / text_bytes
    # per core-second of the baseline's processes (driver included): unlike its wall time,
    # this does not depend on how much of the 2 cores other processes took meanwhile
    per_core = text_bytes / med(S["base"].cpu) / 1e6
    node_text = per_core * a.node_cores
    node_out = node_text * out_per_text
    fleet_out = node_out * a.nodes

    def overhead(key: str) -> str:
        """Extra time against the baseline, per round, median: load-adjusted, the same
        without the start-up part, wall, CPU seconds."""
        adj = adjusted(S[key].seconds, S[key].other)
        start = S[key].extra["start"]
        pct = med([x / b - 1 for x, b in zip(adj, base_adj, strict=True)]) * 100
        wo = med([(x - st) / b - 1 for x, st, b in zip(adj, start, base_adj, strict=True)]) * 100
        raw = (ratio(key, "base") - 1) * 100
        cpu = (ratio(key, "base", "cpu") - 1) * 100
        return (f"{pct:+.1f}% ({wo:+.1f}% without the {med(start):.2f} s of start-up; wall "
                f"{raw:+.1f}%, CPU {cpu:+.1f}%)")

    chunk_core_s = DEFAULT_CHUNK_BYTES * (text_bytes / jsonl_bytes) / (per_core * 1e6)
    pool_w, pool_c, pool_d = per_chunk["pool"]
    ray_w, ray_c, ray_d = per_chunk["raychunks"]
    in_run_splice = med([sp / t for sp, t in zip(S["base"].extra["splice"], S["base"].seconds,
                                                 strict=True)]) * 100
    tasks_per_s = a.node_cores * a.nodes / chunk_core_s
    out("derived (medians; assumption: every core of a node tokenizes at this machine's "
        "measured rate per CPU-second):")
    out(f"- overhead vs the local pool on the same {cores} cores (load-adjusted times): "
        f"Ray 2-node cluster {overhead('ray')}; Ray local {overhead('ray_local')}, its "
        f"ray.init alone {med(S['ray_local'].extra['init']):.2f} s; SLURM way "
        f"{overhead('slurm')}, of which the merge {med(S['slurm'].extra['merge']):.2f} s")
    out(f"- overhead per chunk: local pool {pool_w * 1e3:.2f} ms wall / {pool_c * 1e3:.2f} ms "
        f"CPU; Ray cluster {ray_w * 1e3:.2f} ms wall / {ray_c * 1e3:.2f} ms CPU (driver "
        f"{ray_d * 1e3:.2f} ms). A default {DEFAULT_CHUNK_BYTES / 2**20:g} MiB chunk takes "
        f"{chunk_core_s:.2f} core-seconds here, so Ray's per-chunk CPU is "
        f"{ray_c / chunk_core_s * 100:.3f}% of a chunk's work (the pool's "
        f"{pool_c / chunk_core_s * 100:.3f}%)")
    out(f"- output per text: {out_per_text:.3f} bytes of .bin + .idx per byte of text "
        f"({text_bytes / base_tokens:.2f} text bytes per token, "
        f"{IndexedDataset(base).dtype.itemsize} bytes per token); input read per text byte: "
        f"{jsonl_per_text:.3f} (jsonl)")
    out(f"- per-core text rate: {per_core:.2f} MB/s (the baseline's text / its CPU seconds, "
        f"driver included; wall: {text_bytes / base_t / WORKERS / 1e6:.2f} MB/s per worker) -> "
        f"one {a.node_cores}-core "
        f"node: {node_text:.0f} MB/s of text, {node_out:.0f} MB/s of tokens to splice; "
        f"{a.nodes} nodes: {node_text * a.nodes / 1e3:.1f} GB/s of text, "
        f"{fleet_out / 1e3:.2f} GB/s of tokens through one splice")
    unlink_ms = med(S["splice"].extra["unlink"]) / n_shards * 1e3
    out(f"- the splice, one driver process, page cache, these shard sizes: the loop "
        f"{rates['splice']:,.0f} MB/s = {rates['splice'] / node_out:.1f} nodes' worth; "
        f"add_index alone {rates['copy']:,.0f} MB/s = {rates['copy'] / node_out:.1f} nodes; "
        f"plain copyfile {rates['copyfile']:,.0f} MB/s = {rates['copyfile'] / node_out:.0f} "
        f"nodes. {a.nodes} nodes need {fleet_out:,.0f} MB/s: {fleet_out / rates['splice']:.1f}x "
        f"the loop, {fleet_out / rates['copyfile']:.2f}x a plain copy. This disk: read "
        f"{rates['read_direct']:,.0f} MB/s, write + fsync {rates['write_fsync']:,.0f} MB/s. "
        f"merge_indexed_datasets (2 parts): {rates['merge_fn']:,.0f} MB/s. In the baseline run "
        f"the driver's add_index + finalize took {in_run_splice:.1f}% of the wall time")
    out(f"- bytes over the network per byte of text with one driver splicing from a shared "
        f"filesystem: {jsonl_per_text:.2f} (workers read jsonl) + {out_per_text:.2f} (workers "
        f"write shards) + {out_per_text:.2f} (driver reads them) + {out_per_text:.2f} (driver "
        f"writes the output) = {jsonl_per_text + 3 * out_per_text:.2f}; at {a.nodes} nodes "
        f"{node_text * a.nodes * (jsonl_per_text + 3 * out_per_text) / 1e3:.1f} GB/s through "
        f"the filesystem, {2 * fleet_out / 1e3:.1f} GB/s of it through the driver's node")
    out(f"- chunks at {a.nodes} nodes with default {DEFAULT_CHUNK_BYTES / 2**20:g} MiB chunks: "
        f"{tasks_per_s:,.0f} tasks (and shards) per second; at the driver's measured "
        f"{ray_d * 1e3:.2f} ms CPU per Ray task (submit, collect, splice) that is "
        f"{tasks_per_s * ray_d:.1f} driver cores; unlinking the shards alone "
        f"({unlink_ms:.2f} ms per shard on this disk) {tasks_per_s * unlink_ms / 1e3:.1f} s per "
        f"second; loading the tokenizer ({unpickle * 1e3:.0f} ms) once per worker process and "
        f"job is {unpickle / chunk_core_s * 100:.1f}% of one chunk's work")

    header = (header_line(f"ray {version('ray')}, tokenizers {version('tokenizers')}",
                          started=started)
              + f"\n{load_before}; os.cpu_count() = {os.cpu_count()}\n")
    shutil.rmtree(work, ignore_errors=True)
    if a.out:
        path = REPO / a.out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + "\n" + "\n".join(lines) + "\n")
        print(f"wrote {a.out}")
    if a.json:
        print(json.dumps({k: v.__dict__ for k, v in S.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
