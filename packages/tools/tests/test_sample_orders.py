"""``inspect-data sample``, ``blend`` and ``plot``: the sample order the trainer will read."""

from __future__ import annotations

import importlib.util
import inspect as pyinspect
import json
import sys
import typing

import numpy as np
import pytest
import typer

from bloomline.dataprep import (
    GPTSampleDataset,
    IndexedDataset,
    IndexedDatasetWriter,
    IndexRequest,
    build_sample_datasets,
    build_sample_index,
)
from bloomline.dataprep import cli as dataprep_cli
from bloomline.tools import index_options
from bloomline.tools.blend_report import document_repeats
from bloomline.tools.cli import app

L = 16
WEIGHTS = {"a": 0.6, "b": 0.4}


def _index_args(cache, weights=WEIGHTS, train=300):
    args = ["--seq-length", L, "--train-samples", train, "--split", "90,10",
            "--cache-dir", cache]
    for name, weight in (weights or {}).items():
        args += ["--weight", f"{name}={weight}"]
    return args


def _built(corpus, cache, weights=WEIGHTS, train=300):
    return build_sample_datasets(corpus["dir"], IndexRequest(
        seq_length=L, train_samples=train, split="90,10", weights=weights), cache_dir=cache)


def test_index_options_are_build_index_options(corpus):
    """Catches: sample/blend/plot drifting from `dataprep build-index` (a renamed option, a
    changed default or help), so that they would inspect another order than the trainer's."""
    theirs = pyinspect.signature(dataprep_cli.build_index).parameters
    ours = pyinspect.signature(index_options.with_index_request(lambda: None)).parameters
    hints = typing.get_type_hints(dataprep_cli.build_index)
    expected = [name for name in theirs if name not in ("corpus_dir", "json_output")]
    assert list(ours) == expected == list(index_options.INDEX_OPTION_NAMES)
    for name in expected:
        mine, other = ours[name].default, theirs[name].default
        assert (mine.default, mine.help) == (other.default, other.help), name
        assert ours[name].annotation == hints[name], name
    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    for command in ("sample", "blend", "plot"):
        flags = {opt for p in commands[command].params for opt in p.opts}
        for name in expected:
            assert "--" + name.replace("_", "-") in flags, (command, name)


def test_sample_is_what_the_trainer_reads(corpus, tmp_path, inspect):
    """Catches: a sample shown from the wrong dataset of the blend, the wrong shuffle
    position, spans with wrong document ids or offsets, or a missing extra token."""
    cache = tmp_path / "cache"
    train = _built(corpus, cache).splits["train"]
    documents = {"a": corpus["docs_a"], "b": corpus["docs_b"]}
    for k in (0, 1, 137, len(train) - 1):
        code, out, _ = inspect("sample", corpus["dir"], "--index", k, "--json",
                               *_index_args(cache))
        result = json.loads(out)
        assert code == 0
        np.testing.assert_array_equal(result["tokens"], train[k])
        number, own = train.source(k)
        assert (result["dataset"], result["dataset_sample"]) == (train.names[number], own)
        # the spans, read from the documents as written: an independent check of ids/offsets
        spans = [documents[result["dataset"]][s["document"]][s["start"] : s["stop"]]
                 for s in result["spans"]]
        np.testing.assert_array_equal(np.concatenate(spans), train[k])
        assert len(train[k]) == L + 1


def test_sample_text_marks_every_document_boundary(corpus, tmp_path, inspect):
    """Catches: boundaries shown without a marker, markers without the dataset name, or the
    decoded text of another sample."""
    cache = tmp_path / "cache"
    train = _built(corpus, cache, train=300).splits["train"]
    # a sample that spans documents: the first whose start is not its last position
    k = next(i for i in range(len(train)) if np.count_nonzero(train[i] == 2) >= 1
             and train[i][-1] != 2)
    code, out, _ = inspect("sample", corpus["dir"], "--index", k, "--tokenizer",
                           corpus["tokenizer"], *_index_args(cache))
    result_code, result_json, _ = inspect("sample", corpus["dir"], "--index", k, "--json",
                                          *_index_args(cache))
    spans = json.loads(result_json)["spans"]
    assert code == result_code == 0 and len(spans) >= 2
    dataset = train.names[train.source(k)[0]]
    assert out.count("⟦doc ") == len(spans) and out.count(f"| dataset {dataset}⟧") == len(spans)
    assert "⟦</s>⟧" in out
    code, out, _ = inspect("sample", corpus["dir"], "--index", k, *_index_args(cache))
    assert code == 0 and " ".join(map(str, train[k][:3])) in out  # ids without a tokenizer


def test_sample_bad_index_and_split(corpus, tmp_path, inspect):
    """Catches: an out-of-range K or an absent split ending in an IndexError traceback."""
    cache = tmp_path / "cache"
    n = len(_built(corpus, cache).splits["train"])
    code, _, err = inspect("sample", corpus["dir"], "--index", n, *_index_args(cache))
    assert code == 1 and err.startswith(f"error: --index {n}: the train split has {n:,}")
    code, _, err = inspect("sample", corpus["dir"], "--index", 0, "--from", "test",
                           *_index_args(cache))
    assert code == 1 and err.startswith("error: --from test: the corpus has no test split")


def _brute_force_seen(component, num_served):
    """Times each sequence is read by the first num_served samples: a plain Python loop."""
    index = component.index
    covered = set()
    for j in range(num_served):
        s = int(index.shuffle_index[j])
        (first, _), (last, last_offset) = index.sample_index[s : s + 2].tolist()
        end = last if last_offset + component.extra > 0 else last - 1
        covered.update(range(first, end + 1))
    seen = np.zeros(len(component.dataset), dtype=np.int64)
    for position in covered:
        seen[int(index.document_index[position])] += 1
    split_ids = np.unique(index.document_index)
    return seen[split_ids]


@pytest.mark.parametrize("weights", [WEIGHTS, None])
def test_blend_shares_and_repeats(corpus, tmp_path, inspect, weights):
    """Catches: realized shares over the wrong prefix (or counted twice across prefixes),
    requested weights mixed up between datasets, and repeat counts that count a document once
    per sample touching it instead of once per reading."""
    cache = tmp_path / "cache"
    train = _built(corpus, cache, weights=weights, train=2000).splits["train"]
    code, out, _ = inspect("blend", corpus["dir"], "--json",
                           *_index_args(cache, weights=weights, train=2000))
    assert code == 0
    result = json.loads(out)
    assert result["samples"] == len(train) and result["blend"] and result["requested"] == 2000
    for number, name in enumerate(train.names):
        row = result["datasets"][name]
        for share in ("0.01", "0.1", "0.5", "1"):
            stop = int(np.ceil(float(share) * len(train)))
            expected = np.count_nonzero(train.dataset_index[:stop] == number) / stop
            assert row["realized"][share] == pytest.approx(expected)
        if weights:
            assert row["weight"] == pytest.approx(weights[name])
        used = int(np.count_nonzero(train.dataset_index == number))
        assert row["used"] == used
        # the blend serves each dataset's samples 0..used-1, in order
        served = train.dataset_sample_index[train.dataset_index == number]
        np.testing.assert_array_equal(np.sort(served), np.arange(used))
        seen = _brute_force_seen(train.datasets[number], used)
        assert row["repeats"]["max"] == seen.max()
        assert row["repeats"]["mean"] == pytest.approx(seen.mean())
        assert row["repeats"]["unseen"] == pytest.approx(np.mean(seen == 0))
    code, out, _ = inspect("blend", corpus["dir"], *_index_args(cache, weights=weights,
                                                                  train=2000))
    assert code == 0 and "first 10%" in out and "mean seen" in out


def test_blend_of_one_dataset(corpus, tmp_path, inspect):
    """Catches: blend crashing on a corpus of one dataset (no blend indices) or counting
    more served samples than the trainer asked for."""
    folder = tmp_path / "single"
    folder.mkdir()
    for suffix in (".bin", ".idx"):
        (folder / f"b{suffix}").write_bytes(corpus["b"].with_suffix(suffix).read_bytes())
    code, out, _ = inspect("blend", folder, "--json", *_index_args(tmp_path / "c", None))
    row = json.loads(out)["datasets"]["b"]
    assert code == 0 and row["used"] == 300 and row["realized"]["1"] == 1.0


def test_plot_writes_a_png(corpus, tmp_path, inspect):
    """Catches: plot failing on a real corpus, writing something that is not a PNG, or
    overwriting an existing output without --overwrite."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "corpus.png"
    args = ["plot", corpus["dir"], "--out", out, *_index_args(tmp_path / "cache")]
    code, text, err = inspect(*args)
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    code, _, err = inspect(*args)
    assert code == 1 and "output exists; pass --overwrite" in err
    code, text, _ = inspect(*args, "--overwrite", "--json")
    assert code == 0 and json.loads(text)["datasets"] == ["a", "b"]


def test_plot_without_matplotlib_says_how_to_install(corpus, tmp_path, inspect, monkeypatch):
    """Catches: a bare ImportError traceback when the optional extra is missing, or the
    index being built before the missing dependency is noticed."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    cache = tmp_path / "cache"
    code, _, err = inspect("plot", corpus["dir"], "--out", tmp_path / "x.png",
                           *_index_args(cache))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "pip install 'bloomline-tools[plot]'" in err
    assert not cache.exists() and not (tmp_path / "x.png").exists()


def test_document_repeats_without_the_extra_token(tmp_path):
    """Catches: a document counted as read when a sample merely ends where it starts (without
    Megatron's extra token, a sample ending at offset 0 of a document reads none of it)."""
    seq_length = 15
    # documents of exactly L tokens make many samples end at offset 0 of the next one; the
    # one of 5 tokens keeps the epochs' tokens off a multiple of L
    with IndexedDatasetWriter(tmp_path / "d", np.uint16) as writer:
        for number in range(61):
            writer.add_document(np.full(5 if number == 30 else seq_length, number + 5))
    dataset = IndexedDataset(tmp_path / "d")
    index = build_sample_index(dataset.sequence_lengths, range(61), seq_length, 100, 1234,
                               add_extra_token=False)
    assert index.num_epochs * index.num_tokens_per_epoch % seq_length != 0
    component = GPTSampleDataset(dataset, index, add_extra_token=False)
    # boundaries: without the extra token Megatron records a start on a document's end as
    # (k, len_k), so the sample reads none of document k
    rows = index.sample_index[1:]
    ends_on_boundary = rows[:, 1] == dataset.sequence_lengths[index.document_index[rows[:, 0]]]
    assert np.count_nonzero(ends_on_boundary) > len(component) // 8
    for served in (1, 3, 7, 12, 25, 50, len(component)):
        seen = _brute_force_seen(component, served)
        repeats = document_repeats(component, served)
        assert (repeats["max"], repeats["unseen"]) == (seen.max(), np.mean(seen == 0))
        assert repeats["mean"] == pytest.approx(seen.mean())


def test_weight_zero_leaves_a_dataset_out_and_is_named_like_build_index(corpus, tmp_path,
                                                                       inspect, capsys,
                                                                       monkeypatch):
    """Bug: `--weight b=0` (what the trainer's data.weights.b=0 means: b left out) refused by
    the inspection commands, or accepted without naming b in their report, so the user
    cannot see that the samples come from a alone; all weights 0 worded differently from
    build-index."""
    cache = tmp_path / "cache"
    zero = _index_args(cache, weights={"a": 1, "b": 0})
    code, out, err = inspect("blend", corpus["dir"], *zero)
    assert code == 0, err
    assert "  left out (weight 0): b" in out.splitlines()
    code, out, _ = inspect("blend", corpus["dir"], *zero, "--json")
    result = json.loads(out)
    assert list(result["datasets"]) == ["a"] and result["left_out"] == ["b"]
    code, out, _ = inspect("sample", corpus["dir"], "--index", 7, *zero, "--json")
    assert code == 0 and json.loads(out)["dataset"] == "a"
    if importlib.util.find_spec("matplotlib"):  # an optional extra
        code, out, _ = inspect("plot", corpus["dir"], "--out", tmp_path / "p.png", *zero)
        assert code == 0 and out.strip().endswith("train split; left out (weight 0): b")
    code, _, tools_err = inspect("blend", corpus["dir"],
                                 *_index_args(cache, weights={"a": 0, "b": 0}))
    monkeypatch.setattr(sys, "argv", ["dataprep", "build-index", str(corpus["dir"]),
                                      *map(str, _index_args(cache, weights={"a": 0, "b": 0}))])
    with pytest.raises(SystemExit):
        dataprep_cli.main()
    dataprep_err = capsys.readouterr().err
    assert code == 1
    assert tools_err == dataprep_err == "error: --weight: the weights must not all be zero\n"
