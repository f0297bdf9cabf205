"""Hostile state of the index cache and hostile build-index requests: each refused in one
line, never a hang, a traceback, a huge allocation or a success that serves nothing."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import (
    IndexedDatasetWriter,
    IndexRequest,
    build_sample_datasets,
    index_cache,
)
from bloomline.dataprep import cli as dataprep_cli


def _corpus(tmp_path: Path, names=("a", "b")) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in names:
        with IndexedDatasetWriter(folder / name, np.uint16) as writer:
            for length in rng.integers(5, 40, size=60):
                writer.add_document(rng.integers(4, 500, size=int(length)))
    return folder


REQUEST = IndexRequest(seq_length=16, train_samples=50, split="90,10")


class _Blocked(BaseException):
    """Not an OSError: no ``except OSError`` of the code under test swallows it."""


@contextlib.contextmanager
def _deadline(seconds: int = 10):
    """A blocked ``open()`` returns EINTR on SIGALRM and the handler's error ends it: a test
    of a FIFO fails instead of hanging the suite."""
    def expire(signum, frame):
        raise _Blocked(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _dataprep(monkeypatch, capsys, *args: object) -> tuple[int, str, str]:
    """``dataprep ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["dataprep", *map(str, args)])
    code = 0
    try:
        dataprep_cli.main()
    except SystemExit as exit_:
        code = exit_.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str, *expected: str) -> str:
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _entry(corpus: Path, pattern: str = "gpt-train-a-*") -> Path:
    return next((corpus / ".index").glob(pattern))


@pytest.mark.parametrize("victim", ["shuffle_index.npy", "description.json"])
def test_fifo_in_a_cache_entry_is_refused_not_opened(tmp_path, monkeypatch, capsys, victim):
    """Bug: a FIFO in place of a cached array or description blocked build-index (and the
    trainer's load) in open() forever, deaf to Ctrl-C and SIGTERM."""
    corpus = _corpus(tmp_path)
    build_sample_datasets(corpus, REQUEST)
    entry = _entry(corpus)
    (entry / victim).unlink()
    os.mkfifo(entry / victim)
    args = ("build-index", corpus, "--seq-length", 16, "--train-samples", 50, "--split", "90,10")
    with _deadline():
        code, _, err = _dataprep(monkeypatch, capsys, *args)
    _one_line(code, err, f"{entry / victim}: the index cache", "FIFO", f"remove {entry}")
    assert (entry / victim).exists()  # what the user put there is not deleted


def test_fifo_in_place_of_a_whole_entry_is_refused(tmp_path):
    """Bug: a FIFO under an entry's name was taken for a missing entry and deleted."""
    corpus = _corpus(tmp_path)
    build_sample_datasets(corpus, REQUEST)
    entry = _entry(corpus)
    index_cache.shutil.rmtree(entry)
    os.mkfifo(entry)
    with _deadline(), pytest.raises(UserError, match="index cache entry is a FIFO"):
        build_sample_datasets(corpus, REQUEST)
    assert entry.exists()


def test_symlinked_bad_entry_loses_the_link_not_its_target(tmp_path, capfd):
    """Bug: rebuilding a symlinked entry left a ``.NAME.PID.trash`` symlink behind (rmtree
    refuses links, its error was ignored); following it would delete content elsewhere."""
    corpus = _corpus(tmp_path)
    build_sample_datasets(corpus, REQUEST)
    entry = _entry(corpus)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "sample_index.npy").write_bytes(b"damaged")
    build_sample_datasets(corpus, REQUEST)
    assert "rebuilding the cache entry" in capfd.readouterr().err
    assert not entry.is_symlink() and (entry / "description.json").is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted(p.name for p in entry.iterdir())
    assert not [p for p in (corpus / ".index").iterdir() if p.name.endswith(".trash")]


def test_full_disk_names_the_file_and_leaves_no_entry(tmp_path, monkeypatch, capsys):
    """Bug: a full disk while writing the cache said only "No space left on device", naming
    no file, so the user could not tell which filesystem to free."""
    corpus = _corpus(tmp_path)
    real_save = np.save

    def full(file, array, **kwargs):
        if Path(file).name == "sample_index.npy":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(file, array, **kwargs)

    monkeypatch.setattr(index_cache.np, "save", full)
    code, _, err = _dataprep(monkeypatch, capsys, "build-index", corpus, "--seq-length", 16,
                             "--train-samples", 50, "--split", "90,10")
    line = _one_line(code, err, "sample_index.npy: cannot write the index cache: No space left",
                     "GiB free")
    assert str(corpus / ".index") in line
    assert not [p.name for p in (corpus / ".index").iterdir() if p.name != ".locks"]
