"""``inspect-data verify`` of a corpus whose index cache holds something that is not a file."""

from __future__ import annotations

import os
import signal

import numpy as np

from bloomline.dataprep import IndexedDatasetWriter, IndexRequest, build_sample_datasets


class _Blocked(BaseException):
    """Not an OSError: no ``except OSError`` of the code under test swallows it."""


def _expire(signum, frame):
    raise _Blocked("inspect-data verify still blocked after 10 s")


def test_verify_refuses_a_fifo_in_the_index_cache(tmp_path, inspect):
    """Bug: a FIFO in place of a cached array (``.index/gpt-train-*/shuffle_index.npy``)
    blocked ``inspect-data verify`` in open() forever, deaf to Ctrl-C."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(corpus / "a", np.uint16) as writer:
        for length in rng.integers(5, 40, size=60):
            writer.add_document(rng.integers(4, 500, size=int(length)))
    build_sample_datasets(corpus, IndexRequest(seq_length=16, train_samples=50, split="9,1"))
    entry = next((corpus / ".index").glob("gpt-train-a-*"))
    (entry / "shuffle_index.npy").unlink()
    os.mkfifo(entry / "shuffle_index.npy")
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.alarm(10)  # a blocked open() gets EINTR, and the handler's error ends the test
    try:
        code, _, err = inspect("verify", corpus)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {entry}/shuffle_index.npy: the index cache array is a "
                               "FIFO (named pipe), not a regular file"), lines[0]
