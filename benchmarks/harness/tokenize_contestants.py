"""What ``benchmarks.tokenize`` and ``benchmarks.tokenize_cluster`` time besides the pipeline:
the limits and the baselines (the corpus itself is ``text_corpus.py``'s).

- :func:`load_batches`: the corpus's texts in memory, batched as the pipeline's chunks cut it
  (:func:`chunk_line_counts`);
- :func:`limit_encoder`: a tokenizer's own batch encode, the per-core limit (``"tokenizer"``:
  our ``Tokenizer.encode_batch``, which for SentencePiece is the library's numpy-returning
  ``Encode``; ``"library"``: ``tokenizers.Tokenizer.encode_batch_fast`` with each encoding's
  ``.ids`` read out, nothing of ours around it, called on a helper thread, where it runs
  fastest; ``"library-main-thread"``: the same on the calling thread);
  :class:`ConcurrentLimit`: the same in w processes at once;
- :func:`naive_loop`: Megatron-style one document at a time (SentencePiece);
- :func:`datasets_map`: ``datasets.Dataset.map(batched=True)`` with a ``tokenizers.Tokenizer``.

The machine (result header, other processes' load) is ``machine.py``'s.
"""

from __future__ import annotations

import filecmp
import json
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bloomline.dataprep.indexed_dataset import write_index
from bloomline.dataprep.sources import (
    DEFAULT_CHUNK_BYTES,
    expand_inputs,
    iter_chunks,
    read_line_range,
)
from bloomline.dataprep.tokenizer import Tokenizer, load_tokenizer


def chunk_line_counts(corpus: Path, workers: int = 1) -> list[int]:
    """The lines (documents) of each chunk the ``workers``-worker pipeline cuts ``corpus``
    into: a byte-range chunk holds the lines whose first byte is in its range (the workers
    read those themselves; the chunk carries no payload)."""
    counts = []
    for chunk in iter_chunks(expand_inputs([str(corpus)]), DEFAULT_CHUNK_BYTES, False, workers):
        if chunk.kind == "range":
            data, _ = read_line_range(chunk.source.path, chunk.start, chunk.stop)
        else:
            data = chunk.payload
        counts.append(data.count(b"\n"))
    return counts


def load_batches(corpus: Path) -> tuple[list[list[str]], dict]:
    """Every text in memory, batched as the pipeline cuts the file into chunks (one worker)."""
    with open(corpus, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    batches, start = [], 0
    for count in chunk_line_counts(corpus):
        batches.append(texts[start : start + count])
        start += count
    assert start == len(texts), "chunk line counts do not cover the corpus"
    sizes = [len(t.encode()) for t in texts]
    return batches, {"documents": len(texts), "text_bytes": sum(sizes), "longest": max(sizes),
                     "non_ascii": sum(not t.isascii() for t in texts)}


# ------------------------------------------------------------------------------ limits


def limit_encoder(tok: Tokenizer, mode: str) -> Callable[[list[str]], list]:
    """The batch encode a limit times (see the module docstring for the modes)."""
    if mode in ("library", "library-main-thread"):
        backend = tok.backend  # the tokenizers.Tokenizer itself

        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in backend.encode_batch_fast(texts)]
        if mode == "library-main-thread":
            return encode
        # The library runs faster on any thread but the main one (glibc's main malloc
        # arena, which the interpreter shares, is slower for its many small allocations), so
        # its best one-thread speed is on a helper thread; the caller waits.
        helper = ThreadPoolExecutor(1, thread_name_prefix="limit-encode")
        return lambda texts: helper.submit(encode, texts).result()
    return tok.encode_batch


def encode_all(batches: list[list[str]], encode) -> int:
    return sum(sum(map(len, encode(batch))) for batch in batches)


def _limit_worker(spec: str, mode: str, batches: list[list[str]], tasks, results) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as each pipeline worker
    encode = limit_encoder(load_tokenizer(spec), mode)
    results.put(0)  # ready: the model is loaded, the texts are in memory
    while (index := tasks.get()) is not None:
        results.put(sum(map(len, encode(batches[index]))))


class ConcurrentLimit:
    """The w-core limit: w processes encoding in-memory texts at once, nothing else running.

    When all cores are busy each may run at another speed than one busy core alone (shared
    caches and memory, and on a virtual machine its neighbours), so the per-worker efficiency
    of w workers is shown against this limit too. Batches are handed out from a queue, as
    the pipeline hands out chunks; the processes start (and load their copy of the texts)
    before the clock starts.
    """

    def __init__(self, spec: Path, mode: str, batches: list[list[str]], workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.num_batches = len(batches)
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=_limit_worker,
                                  args=(str(spec), mode, batches, self.tasks, self.results))
                      for _ in range(workers)]
        for proc in self.procs:
            proc.start()
        for _ in self.procs:
            self.results.get()

    def __call__(self) -> int:
        for index in range(self.num_batches):
            self.tasks.put(index)
        return sum(self.results.get() for _ in range(self.num_batches))

    def cpu_seconds(self) -> float:
        """CPU seconds its (live, so not yet counted in os.times) processes have used."""
        total = 0
        for proc in self.procs:
            with open(f"/proc/{proc.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for proc in self.procs:
            proc.join()


# --------------------------------------------------------------------------- baselines


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


def load_hf_dataset(corpus: Path, cache: Path):
    """The corpus as a ``datasets`` Dataset (its Arrow copy is cached in ``cache``)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets.load_dataset("json", data_files=str(corpus), split="train",
                                 cache_dir=str(cache))


def _map_ids(batch: dict, tokenizer) -> dict:
    return {"input_ids": [e.ids for e in tokenizer.encode_batch_fast(batch["text"])]}


def datasets_map(dataset, tokenizer, num_proc: int, scratch: Path) -> int:
    """``dataset.map(batched=True)`` to ``input_ids`` (int32 lists), as HF's recipes do.

    What it includes: datasets hashing the function for the cache fingerprint, starting
    ``num_proc`` processes (sending them the tokenizer), reading the text column from the
    Arrow file, ``encode_batch_fast`` + ``.ids`` per batch of 1,000 documents (map's
    default), and writing the ids into map's own Arrow cache file(s) in ``scratch`` (deleted
    afterwards). The input columns are dropped, so nothing else is written. One thread per
    process (TOKENIZERS_PARALLELISM=false, as the caller sets). Returns the token count.
    """
    import datasets
    import pyarrow.compute as pc

    out_dir = Path(tempfile.mkdtemp(prefix="map.", dir=scratch))
    try:
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
        out = dataset.map(_map_ids, batched=True, fn_kwargs={"tokenizer": tokenizer},
                          num_proc=num_proc if num_proc > 1 else None,
                          remove_columns=dataset.column_names, features=features,
                          cache_file_name=str(out_dir / "map.arrow"),
                          load_from_cache_file=False)
        num_tokens = int(pc.sum(pc.list_value_length(out.data.column("input_ids"))).as_py())
        del out
        return num_tokens
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def same_files(a: Path, b: Path) -> bool:
    return all(filecmp.cmp(f"{a}{s}", f"{b}{s}", shallow=False) for s in (".bin", ".idx"))
