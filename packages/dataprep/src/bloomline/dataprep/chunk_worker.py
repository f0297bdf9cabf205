"""One worker's side of ``dataprep tokenize``: set up once per process, then chunk -> shard.

Mental model::

    init_worker(tokenizer, keys, ...)   once per worker process (pool worker or Ray worker)
    tokenize_chunk(chunk)               chunk -> documents -> token ids -> a shard .bin/.idx

Both the local process pool (:mod:`bloomline.dataprep.tokenize_corpus`) and the Ray tasks
(:mod:`bloomline.dataprep.ray_tasks`) run these two functions, so a chunk's shard has the same
bytes whichever engine ran it. The worker's state (its tokenizer, loaded once, and the job's
options) lives in this module; :func:`worker_job` says which job it was set up for, so a Ray
worker process reused by a later job sets itself up again.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bloomline.common import faults
from bloomline.common.errors import UserError
from bloomline.dataprep.documents import extract_documents
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.dataprep.sources import Chunk
from bloomline.dataprep.tokenizer import Tokenizer

__all__ = [
    "STOP_SIGNALS",
    "ChunkResult",
    "encode_documents",
    "init_worker",
    "stop_signals_blocked",
    "tokenize_chunk",
    "worker_job",
]

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})

# Per-process state of a worker: the tokenizer is loaded once, not once per chunk.
_state: dict = {}


@dataclass
class ChunkResult:
    """What a worker reports about one chunk: its shards (key -> prefix) and its counts."""

    index: int
    shards: dict[str, str]
    num_documents: int
    num_tokens: dict[str, int]
    num_empty: dict[str, int]
    num_skipped: int
    skipped_messages: list[str]
    text_bytes: int
    source_bytes: int


def init_worker(tokenizer: Tokenizer, keys: list[str], append_eod: bool, skip_bad_lines: bool,
                max_document_bytes: int, scratch: str, ignore_sigint: bool,
                parent: int | None = None, job: str | None = None) -> None:
    """Set up this process to tokenize the chunks of one job.

    Args:
        tokenizer: arrives pickled as its spec and is loaded here, once per worker.
        keys, append_eod, skip_bad_lines, max_document_bytes: the job's options (see
            ``tokenize_corpus``).
        scratch: the job's scratch folder, where shards are written (the last of the job's
            arguments: Ray names the job by it).
        ignore_sigint: leave Ctrl-C and SIGTERM to the main process (pool workers).
        parent: die with this process (pool workers; see :func:`_die_with_parent`).
        job: a name of the job, returned by :func:`worker_job` afterwards.
    """
    if ignore_sigint:
        # The main process alone handles Ctrl-C and SIGTERM (a terminal or SLURM signals the
        # whole group): it kills the workers and cleans up. They arrive here blocked
        # (stop_signals_blocked), so one sent while the worker started waits, then is dropped.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if parent is not None:
        _die_with_parent(parent)
    # One thread per worker: Hugging Face tokenizers would otherwise run each batch on a
    # thread pool of every core, in every worker (cores x workers threads fighting).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _state.update(tokenizer=tokenizer, keys=keys, append_eod=append_eod,
                  skip_bad_lines=skip_bad_lines, max_document_bytes=max_document_bytes,
                  scratch=Path(scratch), job=job)


def worker_job() -> str | None:
    """The job this process was last set up for by :func:`init_worker`, or None."""
    return _state.get("job")


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Make this worker die when the main process ``parent`` does, even by ``kill -9``.

    On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` sends SIGKILL the moment
    the parent exits, whatever the worker is doing (deep in a tokenizer's C++ code, holding the
    GIL, where a watching thread could not run). The kernel ties it to the thread that started
    the worker, which is the thread that runs the job (the pool starts its processes on
    ``submit``) and outlives the pool. A parent that died before the call is caught by
    comparing ``getppid``. Elsewhere, a daemon thread polls ``getppid`` twice a second.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # died before the prctl: no signal will come
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def encode_documents(tokenizer: Tokenizer, texts: list[str], append_eod: bool
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(concatenated tokens, per-document lengths) of ``texts``.

    EOD is appended only to non-empty documents, as Megatron's preprocessing does: an empty
    document stays empty and later repeats its boundary in the index.
    """
    ids = tokenizer.encode_batch(texts)  # one int32 array per text
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if append_eod:
        lengths += lengths > 0
    tokens = np.empty(int(lengths.sum()), dtype=tokenizer.token_dtype)
    if not ids:
        return tokens, lengths
    concatenated = np.concatenate(ids)
    _check_id_range(tokenizer, concatenated)
    if append_eod:
        # the EOD slots are the last position of each non-empty document; the ids fill the
        # rest in order (and are cast to the token dtype: every id is below the vocab size,
        # checked above)
        eod_positions = np.cumsum(lengths)[lengths > 0] - 1
        is_text = np.ones(len(tokens), dtype=bool)
        is_text[eod_positions] = False
        tokens[is_text] = concatenated
        tokens[eod_positions] = tokenizer.eod_id
    else:
        tokens[:] = concatenated
    return tokens, lengths


def _check_id_range(tokenizer: Tokenizer, ids: np.ndarray) -> None:
    """Refuse ids outside ``[0, vocab_size)``: the cast to the token dtype (uint16 below a
    vocabulary of 65,500) would wrap them silently into other tokens' ids."""
    if not len(ids):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= tokenizer.vocab_size:
        bad = low if low < 0 else high
        raise UserError(f"{tokenizer.spec}: the tokenizer gave id {bad:,}, outside its "
                        f"vocabulary [0, {tokenizer.vocab_size:,}) that the token files' "
                        f"{tokenizer.token_dtype} holds; nothing was written, fix the "
                        "tokenizer's files")


def tokenize_chunk(chunk: Chunk) -> ChunkResult:
    """Tokenize one chunk into a shard per key in the scratch folder (after :func:`init_worker`)."""
    faults.fire("chunk", chunk=chunk.index)
    tokenizer: Tokenizer = _state["tokenizer"]
    keys: list[str] = _state["keys"]
    docs = extract_documents(chunk, keys, _state["skip_bad_lines"],
                             _state["max_document_bytes"])
    shards, num_tokens, num_empty = {}, {}, {}
    for key in keys:
        tokens, lengths = encode_documents(tokenizer, docs.texts[key], _state["append_eod"])
        shard = str(_state["scratch"] / f"chunk{chunk.index:08d}_{key}")
        # overwrite: a retried task (Ray) replaces what an attempt that died left behind
        with IndexedDatasetWriter(shard, tokenizer.token_dtype, overwrite=True) as writer:
            writer.add_documents(tokens, lengths)
            faults.fire("shard", chunk=chunk.index)  # (a full disk, in the survival tests)
        shards[key] = shard
        num_tokens[key] = len(tokens)
        num_empty[key] = int((lengths == 0).sum())
    return ChunkResult(chunk.index, shards, docs.num_documents, num_tokens, num_empty,
                        docs.num_skipped, docs.skipped_messages, docs.text_bytes,
                        chunk.source_bytes)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM while worker processes start, so that they start with them
    blocked (a blocked set survives fork and exec) until :func:`init_worker` ignores them: one
    that lands while a worker still imports cannot kill it with a traceback. This thread gets
    a signal held back here when the block ends, so the main process still stops on it.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
