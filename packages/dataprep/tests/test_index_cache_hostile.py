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
from bloomline.common.errors import SettingError
from bloomline.dataprep import (
    IndexedDatasetWriter,
    IndexRequest,
    build_index,
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


BUILD = ("--seq-length", 16, "--split", "90,10")


def test_request_beyond_the_machines_memory_is_refused_before_allocating(tmp_path, monkeypatch,
                                                                         capsys):
    """Bug: ``--train-samples 1e11`` (an allowed value) died in a MemoryError traceback (and
    the trainer the same) after allocating what it could, sometimes leaving cache entries of
    a run that never started."""
    corpus = _corpus(tmp_path)
    code, _, err = _dataprep(monkeypatch, capsys, "build-index", corpus, *BUILD,
                             "--train-samples", 10**11, "--weight", "a=1", "--weight", "b=2")
    _one_line(code, err, "--train-samples 100,000,000,000: building its largest index needs",
              "TiB of memory and this machine has", "available")
    assert not (corpus / ".index").exists() or not [
        p for p in (corpus / ".index").iterdir() if p.name != ".locks"]
    with pytest.raises(SettingError) as raised:  # the trainer words it as its own key
        build_sample_datasets(corpus, IndexRequest(seq_length=16, train_samples=10**11, split="9,1",
                                                   weights={"a": 1.0, "b": 2.0}))
    assert raised.value.setting == "train_samples"


def test_request_beyond_the_free_disk_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    """Bug: a request whose indices could not fit the cache folder's disk wrote entries until
    the disk was full, leaving gigabytes of cache behind a failed run."""
    corpus = _corpus(tmp_path)
    monkeypatch.setattr(build_index, "free_disk", lambda path: 1000)
    code, _, err = _dataprep(monkeypatch, capsys, "build-index", corpus, *BUILD,
                             "--train-samples", 50)
    _one_line(code, err, "--train-samples 50: the index cache needs", f"{corpus / '.index'}",
              "1000 B free")
    assert not (corpus / ".index").exists()
    monkeypatch.undo()
    build_sample_datasets(corpus, REQUEST)
    monkeypatch.setattr(build_index, "free_disk", lambda path: 0)
    assert len(build_sample_datasets(corpus, REQUEST).splits["train"]) >= 50  # all reused


@pytest.mark.parametrize(("weights", "expected"), [
    (("a=1e308", "b=1e308"), "--weight: the weights add up to more than a float64 holds"),
    (("a=inf", "b=1"), "--weight a=... inf: the weight must be a finite number >= 0"),
    (("a=-1", "b=1"), "--weight a=... -1.0: the weight must be a finite number >= 0"),
    (("a=0", "b=0"), "--weight: the weights must not all be zero"),
])
def test_weights_that_cannot_be_normalized_are_refused(tmp_path, monkeypatch, capsys, weights,
                                                       expected):
    """Bug: ``--weight a=1e308 --weight b=1e308`` overflowed the sum to inf, every weight
    normalized to 0, and build-index reported "0 samples" with exit 0."""
    corpus = _corpus(tmp_path)
    args = [x for weight in weights for x in ("--weight", weight)]
    code, _, err = _dataprep(monkeypatch, capsys, "build-index", corpus, *BUILD,
                             "--train-samples", 50, *args)
    _one_line(code, err, expected)


def test_weight_zero_leaves_a_dataset_out_as_in_the_trainer(tmp_path, monkeypatch, capsys):
    """Bug: build-index refused ``--weight NAME=0`` while the trainer took
    ``data.weights.NAME=0``, so no inspect tool could show what such a run reads; and the
    weight-0 dataset still had its index built."""
    corpus = _corpus(tmp_path, names=("a", "b", "c"))
    code, out, err = _dataprep(monkeypatch, capsys, "build-index", corpus, *BUILD,
                               "--train-samples", 50, "--weight", "a=0", "--weight", "b=3",
                               "--weight", "c=1")
    assert code == 0, err
    assert "left out (weight 0): a" in out
    assert not list((corpus / ".index").glob("gpt-*-a-*"))
    built = build_sample_datasets(corpus, IndexRequest(
        seq_length=16, train_samples=50, split="90,10", weights={"a": 0.0, "b": 3.0, "c": 1.0}))
    train = built.splits["train"]
    assert train.names == ["b", "c"] and len(train) >= 50
    assert built.report["splits"]["train"]["left_out"] == ["a"]


def test_fifo_in_place_of_a_lock_file_is_refused(tmp_path):
    """Bug: the build's lock file was opened whatever it was; a FIFO or device put in its
    place was locked (or blocked on) instead of being named."""
    corpus = _corpus(tmp_path, names=("a",))
    build_sample_datasets(corpus, REQUEST)
    entry = _entry(corpus)
    lock = corpus / ".index" / ".locks" / f"{entry.name}.lock"
    lock.unlink()
    os.mkfifo(lock)
    index_cache.shutil.rmtree(entry)
    with _deadline(), pytest.raises(UserError, match="index cache lock is a FIFO"):
        build_sample_datasets(corpus, REQUEST)
