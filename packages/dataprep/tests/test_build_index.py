"""``dataprep build-index``: the API, its cache, concurrency, bad input and megatron-core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import (
    BlendedSampleDataset,
    IndexedDatasetWriter,
    IndexRequest,
    build_sample_datasets,
)


def _write(folder: Path, name: str, lengths, dtype=np.uint16, seed=0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(folder / name, dtype, overwrite=True) as writer:
        for length in lengths:
            writer.add_document(rng.integers(4, 1000, size=int(length)))
    return folder / name


def _corpus(tmp_path: Path, sizes=(300, 120, 60)) -> Path:
    rng = np.random.default_rng(1)
    for number, (name, count) in enumerate(zip("abc", sizes, strict=False)):
        _write(tmp_path / "corpus", name, rng.integers(1, 90, size=count), seed=number)
    return tmp_path / "corpus"


def _stream(component, index) -> np.ndarray:
    """All tokens of a split in document-index order: what samples are cut from."""
    return np.concatenate([component.dataset[int(d)] for d in index.document_index])


def test_samples_are_windows_of_the_shuffled_document_stream(tmp_path):
    """Catches: samples with the wrong length, skipped or repeated tokens, documents missing
    from an epoch or seen twice in one."""
    corpus = _corpus(tmp_path, sizes=(200,))
    built = build_sample_datasets(corpus, IndexRequest(seq_length=32, train_samples=900,
                                                       split="90,10"))
    train = built.splits["train"]
    index = train.index
    assert index.num_epochs > 1 and len(train) >= 900
    # each full epoch holds every train document exactly once
    per_epoch = np.arange(180)
    epochs = index.document_index.reshape(index.num_epochs, -1) if not (
        index.separate_last_epoch) else None
    if epochs is None:  # separate last epoch: E-1 epochs shuffled together, then one
        first = np.sort(index.document_index[: (index.num_epochs - 1) * 180])
        np.testing.assert_array_equal(first, np.repeat(per_epoch, index.num_epochs - 1))
        np.testing.assert_array_equal(np.sort(index.document_index[-180:]), per_epoch)
    else:
        np.testing.assert_array_equal(np.sort(index.document_index),
                                      np.repeat(per_epoch, index.num_epochs))
    stream = _stream(train, index)
    for i in range(0, len(train), 7):
        j = int(index.shuffle_index[i])
        sample = train[i]
        assert sample.dtype == np.int64 and len(sample) == 33
        np.testing.assert_array_equal(sample, stream[32 * j : 32 * j + 33])
    assert built.splits["valid"].index.num_epochs == 1  # no count: one epoch


def test_blend_serves_component_samples(tmp_path):
    """Catches: a blend that serves the wrong dataset's sample, or proportions that drift
    from the weights."""
    corpus = _corpus(tmp_path)
    request = IndexRequest(seq_length=16, train_samples=1000, split="1",
                           weights={"a": 0.5, "b": 0.3, "c": 0.2})
    built = build_sample_datasets(corpus, request)
    blend = built.splits["train"]
    assert isinstance(blend, BlendedSampleDataset) and len(blend) == 1000
    for i in range(0, 1000, 13):
        d, s = blend.source(i)
        np.testing.assert_array_equal(blend[i], blend.datasets[d][s])
    rows = built.report["splits"]["train"]["datasets"]
    assert [rows[n]["used"] for n in "abc"] == [500, 300, 200]
    # each dataset is built for ceil(ceil(N * w) * 1.005) samples, as megatron-core does
    assert [rows[n]["requested"] for n in "abc"] == [503, 302, 201]


def test_no_weights_means_one_epoch_each_by_size(tmp_path):
    """Catches: an unweighted corpus blended by document count instead of sample count,
    or a dataset repeated although no weights asked for more than one epoch."""
    corpus = _corpus(tmp_path)
    built = build_sample_datasets(corpus, IndexRequest(seq_length=16, train_samples=10**6,
                                                       split="1"))
    rows = built.report["splits"]["train"]["datasets"]
    assert all(row["epochs"] == 1 and row["used"] == row["samples"] for row in rows.values())
    assert len(built.splits["train"]) == sum(row["samples"] for row in rows.values())


def test_cache_is_reused_and_keyed_by_every_input(tmp_path):
    """Catches: a stale index reused after an input changed (Megatron's key ignores the
    extra-token setting), or a rebuild when nothing changed."""
    corpus = _corpus(tmp_path)
    base = dict(seq_length=16, train_samples=200, split="1")
    first = build_sample_datasets(corpus, IndexRequest(**base))
    again = build_sample_datasets(corpus, IndexRequest(**base))
    statuses = [r["status"] for r in again.report["splits"]["train"]["datasets"].values()]
    assert statuses == ["reused"] * 3
    assert again.report["splits"]["train"]["blend"]["status"] == "reused"
    np.testing.assert_array_equal(first.splits["train"].dataset_index,
                                  again.splits["train"].dataset_index)
    variants = [dict(seq_length=17), dict(seed=5), dict(train_samples=201),
                dict(split="1,0"), dict(add_extra_token=False),
                dict(weights={"a": 1.0, "b": 1.0, "c": 2.0})]
    seen = {first.report["splits"]["train"]["blend"]["cache"]}
    for change in variants:
        report = build_sample_datasets(corpus, IndexRequest(**{**base, **change})).report
        seen.add(report["splits"]["train"]["blend"]["cache"])
    assert len(seen) == 1 + len(variants) - 1  # split "1" and "1,0" normalize the same
    # a rewritten .idx (same name, other content) is another input
    _write(corpus, "c", [50] * 60, seed=9)
    report = build_sample_datasets(corpus, IndexRequest(**base)).report
    assert report["splits"]["train"]["datasets"]["c"]["status"] == "built"


def test_truncated_or_mismatched_cache_entry_is_rebuilt(tmp_path, capfd):
    """Catches: a truncated .npy (killed copy, full disk) or a tampered entry served as if
    valid."""
    corpus = _corpus(tmp_path, sizes=(100,))
    request = IndexRequest(seq_length=8, train_samples=300, split="1")
    good = build_sample_datasets(corpus, request)
    entry = Path(good.report["splits"]["train"]["datasets"]["a"]["cache"])
    expected = np.array(good.splits["train"].index.shuffle_index)
    with open(entry / "shuffle_index.npy", "r+b") as fh:
        fh.truncate(os.path.getsize(entry / "shuffle_index.npy") - 8)
    rebuilt = build_sample_datasets(corpus, request)
    assert "truncated" in capfd.readouterr().err
    assert rebuilt.report["splits"]["train"]["datasets"]["a"]["status"] == "built"
    np.testing.assert_array_equal(rebuilt.splits["train"].index.shuffle_index, expected)
    description = json.loads((entry / "description.json").read_text())
    description["description"]["seed"] = 999
    (entry / "description.json").write_text(json.dumps(description))
    build_sample_datasets(corpus, request)
    assert "does not match" in capfd.readouterr().err


def _tamper(path: Path, edit) -> None:
    """Rewrite a cached .npy in place with ``edit`` applied (same shape and dtype)."""
    array = np.load(path)
    edit(array)
    np.save(path, array)


def test_tampered_cache_values_are_named_and_rebuilt(tmp_path, capfd):
    """Catches: a cached index whose shapes and dtypes are right but whose values point
    outside the arrays (a shuffle entry past the samples, a document id outside the split, a
    sample start past its document, a blend entry past a dataset's samples) loaded as valid:
    the compiled gather then read outside its arrays (a segfault) or looped for long. Loading
    names the file in one warning line and rebuilds the entry, identical to the first build."""
    corpus = _corpus(tmp_path, sizes=(100, 80))
    request = IndexRequest(seq_length=8, train_samples=300, split="1",
                           weights={"a": 0.6, "b": 0.4})
    good = build_sample_datasets(corpus, request)
    row = good.report["splits"]["train"]["datasets"]["a"]
    entry = Path(row["cache"])
    blend = Path(good.report["splits"]["train"]["blend"]["cache"])
    expected = good.splits["train"].get_batch(np.arange(len(good.splits["train"])))
    samples = row["samples"]
    cases = [
        (entry / "shuffle_index.npy", lambda a: a.__setitem__(17, samples),
         f"shuffle_index.npy: entry 17 is {samples}, outside the samples built [0, {samples})"),
        (entry / "document_index.npy", lambda a: a.__setitem__(3, 100),
         "document_index.npy: entry 3 is 100, outside the split's sequence ids [0, 100)"),
        (entry / "sample_index.npy", lambda a: a.__setitem__((5, 1), 10**6),
         "sample_index.npy: row 5 starts at token 1000000 of a sequence of"),
        (entry / "sample_index.npy", lambda a: a.__setitem__((5, 0), 10**6),
         "sample_index.npy: row 5 starts at document-index position 1000000"),
        (blend / "dataset_sample_index.npy", lambda a: a.__setitem__(2, 10**6),
         "dataset_sample_index.npy: entry 2 is sample 1000000 of dataset"),
        (blend / "dataset_index.npy", lambda a: a.__setitem__(2, 7),
         "dataset_index.npy: entry 2 is 7, outside the datasets [0, 2)"),
    ]
    for path, edit, message in cases:
        _tamper(path, edit)
        rebuilt = build_sample_datasets(corpus, request)
        warnings = capfd.readouterr().err.strip().splitlines()
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith(f"warning: {path.parent}/{message}"), warnings
        assert warnings[0].endswith("; rebuilding the cache entry")
        np.testing.assert_array_equal(rebuilt.splits["train"].get_batch(
            np.arange(len(expected))), expected)


def test_tampered_cache_that_cannot_be_rebuilt_is_one_line(tmp_path, monkeypatch):
    """Catches: a bad entry in a cache folder the run cannot write (a shared, read-only
    cache) surfacing as a PermissionError traceback: it must be one line naming the file and
    saying to delete the entry or use another cache folder."""
    import errno

    from bloomline.dataprep import index_cache

    corpus = _corpus(tmp_path, sizes=(100,))
    request = IndexRequest(seq_length=8, train_samples=300, split="1")
    entry = Path(build_sample_datasets(corpus, request)
                 .report["splits"]["train"]["datasets"]["a"]["cache"])
    _tamper(entry / "shuffle_index.npy", lambda a: a.__setitem__(0, 2**31))

    def read_only(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))
    monkeypatch.setattr(index_cache, "_locked", read_only)  # (root may write anywhere)
    with pytest.raises(UserError) as info:
        build_sample_datasets(corpus, request)
    assert str(info.value).startswith(f"{entry}/shuffle_index.npy: entry 0 is 2147483648")
    assert str(info.value).endswith(f"cannot rebuild it here (Permission denied): delete "
                                    f"{entry} or give another --cache-dir")


def _blocked_flock_waiters(lock: Path) -> int:
    inode = os.stat(lock).st_ino
    with open("/proc/locks") as fh:
        return sum(1 for line in fh if "->" in line and f":{inode} " in line)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux /proc/locks")
def test_two_processes_build_one_cache(tmp_path):
    """Catches: two ranks building the same index at once and clobbering each other, or a
    waiter reading a half-written entry. The test holds the lock until both processes are
    blocked on it, so they really do arrive together."""
    import fcntl

    corpus = _corpus(tmp_path, sizes=(400,))
    args = ["--seq-length", "8", "--train-samples", "5000", "--split", "1", "--json"]
    # learn the lock's name from a build elsewhere (same inputs, same key)
    probe = tmp_path / "probe"
    build_sample_datasets(corpus, IndexRequest(seq_length=8, train_samples=5000, split="1"),
                          cache_dir=probe)
    (lock_name,) = os.listdir(probe / ".locks")
    cache = corpus / ".index"
    (cache / ".locks").mkdir(parents=True)
    lock = cache / ".locks" / lock_name
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "bloomline.dataprep.cli", "build-index", str(corpus), *args]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        # poll a condition (both blocked in flock), not a guess at how long start-up takes
        while _blocked_flock_waiters(lock) < 2:
            assert all(p.poll() is None for p in procs), "a process ended before the lock"
            assert time.monotonic() < deadline, "the processes never reached the lock"
            time.sleep(0.01)
    finally:
        os.close(fd)  # release: one builds, the other waits for it, then loads it
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    statuses = sorted(json.loads(out)["splits"]["train"]["datasets"]["a"]["status"]
                      for out, _ in outputs)
    assert statuses == ["built", "reused"]
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in probe.iterdir() if not p.name.startswith("."))
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]
    for entry in (p for p in probe.iterdir() if not p.name.startswith(".")):
        for array in entry.glob("*.npy"):
            np.testing.assert_array_equal(np.load(array), np.load(cache / entry.name / array.name))


def _error_line(result) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "expected"), [
    (["--weight", "zzz=1"], "--weight zzz=...: no dataset 'zzz'"),
    (["--weight", "a=-1", "--weight", "b=1"], "--weight a=... -1.0: the weight must be a "
                                              "finite number >= 0 (0 leaves the dataset out)"),
    (["--weight", "a=x"], "'x' is not a number"),
    (["--weight", "a"], "expected NAME=WEIGHT"),
    (["--weight", "a=1"], "every dataset needs a weight when any has one; missing: b"),
    (["--split", "9,x"], "--split '9,x'"),
    (["--seq-length", "0"], "--seq-length 0: must be at least 1"),
    (["--seq-length", "100000"], "a.idx: the train split (--split 9,1) has 0 samples and "
                                 "needs at least 1: its 27 sequences hold 1080 tokens"),
    (["--split", "999,1"], "the valid split (999,1) gets none of its 30 sequences; give the "
                           "split a larger share with --split (a 0 share leaves it out: "
                           "--split 999,0)"),
    # a test split too small for one sample (the demo corpus at --seq-length 2048): the line
    # says which flag fixes it and how
    (["--split", "80,17,3", "--seq-length", "100"],
     "a.idx: the test split (--split 80,17,3) has 0 samples and needs at least 1: its 1 "
     "sequences hold 40 tokens, too few for one sample of 101; lower --seq-length or give the "
     "split a larger share with --split (a 0 share leaves it out: --split 80,17,0)"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, cli, extra, expected):
    """Catches: tracebacks or vague errors for mistakes a user makes on the command line,
    and index files left behind by a failed build."""
    corpus = tmp_path / "corpus"
    _write(corpus, "a", [40] * 30)
    _write(corpus, "b", [40] * 30, seed=1)
    defaults = {"--seq-length": "8", "--train-samples": "100", "--split": "9,1"}
    overridden = [flag for flag in extra if flag in defaults]
    args = [x for flag, value in defaults.items() if flag not in overridden
            for x in (flag, value)]
    result = cli("build-index", corpus, *args, *extra)
    assert expected in _error_line(result)
    # every check runs before anything is built
    assert not (corpus / ".index").exists()


@pytest.mark.slow
def test_different_token_dtypes_are_refused(tmp_path, cli):
    """Catches: a blend of files from two tokenizers (uint16 and int32 tokens)."""
    corpus = tmp_path / "corpus"
    _write(corpus, "a", [40] * 30)
    _write(corpus, "b", [40] * 30, dtype=np.int32)
    line = _error_line(cli("build-index", corpus, "--seq-length", "8",
                           "--train-samples", "10"))
    assert "b.idx: tokens are int32, but" in line and "a.idx holds uint16" in line


@pytest.mark.slow
def test_blend_past_a_datasets_end_names_it_and_the_fix(tmp_path, cli):
    """Catches: a blend that silently reads past a dataset's samples. With --surplus 0 and
    these weights, one sample of four gives each dataset a target of one, but the rule
    draws two from 'a' and 'c' (found by search; megatron-core raises IndexError here)."""
    corpus = tmp_path / "corpus"
    for number, name in enumerate("abcd"):
        _write(corpus, name, [9], seed=number)  # 9 tokens at L=8: one sample per epoch
    weights = {"a": 0.7351420935106531, "b": 0.001127990868599017,
               "c": 0.5323970705048809, "d": 0.030854897049270157}
    args = [x for name, w in weights.items() for x in ("--weight", f"{name}={w!r}")]
    line = _error_line(cli("build-index", corpus, "--seq-length", "8", "--train-samples", "1",
                           "--split", "1", "--surplus", "0", *args))
    assert "draws 2 samples from 'a' but its index holds 1; raise --surplus" in line
    ok = cli("build-index", corpus, "--seq-length", "8", "--train-samples", "1", "--split",
             "1", *args)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_cli_reports_what_was_built(tmp_path, cli):
    """Catches: a report that omits the per-dataset figures or the cache location."""
    corpus = _corpus(tmp_path)
    result = cli("build-index", corpus, "--seq-length", "16", "--train-samples", "500",
                 "--split", "9,1", "--weight", "a=2", "--weight", "b=1", "--weight", "c=1")
    assert result.returncode == 0, result.stderr
    assert "train: 500 samples (requested 500); blend built" in result.stdout
    assert "realized" in result.stdout and "0.5000" in result.stdout
    report = json.loads(cli("build-index", corpus, "--seq-length", "16", "--train-samples",
                            "500", "--split", "9,1", "--weight", "a=2", "--weight", "b=1",
                            "--weight", "c=1", "--json").stdout)
    row = report["splits"]["train"]["datasets"]["a"]
    assert row["status"] == "reused" and row["realized"] == 0.5 and row["weight"] == 0.5
    assert set(row) >= {"documents", "tokens", "epochs", "samples", "separate_last_epoch"}
    assert Path(row["cache"]).is_dir()


def test_api_refuses_bad_requests_before_building(tmp_path):
    """Catches: a bad request found only after minutes of index building."""
    corpus = _corpus(tmp_path)
    with pytest.raises(UserError, match="--train-samples 0"):
        build_sample_datasets(corpus, IndexRequest(seq_length=8, train_samples=0))
    with pytest.raises(UserError, match="no .idx files"):
        build_sample_datasets(tmp_path, IndexRequest(seq_length=8, train_samples=1))
    assert not (corpus / ".index").exists()


def test_blend_get_batch_equals_stacked_samples(tmp_path):
    """Bug: a blend's batched read that serves another dataset's sample, puts rows back in
    the wrong order after grouping them by dataset, or mishandles a batch of one dataset,
    duplicates, negative indices or an index past the end."""
    corpus = _corpus(tmp_path)
    request = IndexRequest(seq_length=16, train_samples=600, split="1",
                           weights={"a": 0.5, "b": 0.3, "c": 0.2})
    blend = build_sample_datasets(corpus, request).splits["train"]
    assert isinstance(blend, BlendedSampleDataset)
    n = len(blend)
    rng = np.random.default_rng(6)
    only_c = np.flatnonzero(np.asarray(blend.dataset_index) == 2)[:9]
    batches = [[0], [n - 1, 0, -1], only_c, [5, 5, 3, 5], rng.integers(-n, n, size=64),
               np.arange(n)]
    for ids in batches:
        batch = blend.get_batch(ids)
        assert batch.dtype == np.uint16 and batch.shape == (len(ids), 17)
        np.testing.assert_array_equal(batch, np.stack([blend[int(i)] for i in ids]))
    with pytest.raises(IndexError, match=f"sample index {n} is out of range for {n} samples"):
        blend.get_batch([1, n])
    assert blend.get_batch([]).shape == (0, 17)
