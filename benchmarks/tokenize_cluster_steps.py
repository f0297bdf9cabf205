"""The measuring steps of ``benchmarks.tokenize_cluster``: the corpus's chunk batches and
head, the ``Runner`` that times one variant per round (wall, CPU of all our processes, the
driver's, other load), the SLURM way, the splice of shards, and the machine's plain rates.

Contract: ``Runner.measure(name, fn, outputs)`` deletes ``outputs`` untimed, runs ``fn`` once
and appends one value per field to ``series[name]``; every helper leaves its outputs for the
caller to compare.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.harness.machine import OtherLoad
from benchmarks.harness.tokenize_contestants import chunk_line_counts
from benchmarks.tokenize_cluster_ray import MarkedProcesses, Probes
from bloomline.dataprep.indexed_dataset import IndexedDataset, IndexedDatasetWriter
from bloomline.dataprep.sources import (
    expand_inputs,
    iter_chunks,
)

WORKERS = 2


# ------------------------------------------------------------------------------ corpus


def chunk_batches(corpus: Path, workers: int) -> tuple[list[list[str]], list[int], dict]:
    """The texts in memory, batched as the ``workers``-worker pipeline cuts the file into
    chunks (byte ranges: a line belongs to the range holding its first byte), the documents
    per chunk, and the corpus's statistics."""
    with open(corpus, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    counts = chunk_line_counts(corpus, workers)
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
    costs time on a disk mounted with ``discard``)."""
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
