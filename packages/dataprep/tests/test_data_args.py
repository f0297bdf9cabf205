"""Megatron's data arguments in ``dataprep build-index``: the forms, the names, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bloomline.dataprep import IndexedDatasetWriter
from bloomline.dataprep.data_args import (
    absolute_data_path,
    data_args,
    dataset_names,
    expand_data_path_argv,
)


def _write(prefix: Path, documents: int, seed: int) -> str:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for length in rng.integers(1, 40, size=documents):
            writer.add_document(rng.integers(4, 1000, size=int(length)))
    return str(prefix)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Three token files in two folders (two share the stem ``train``), cwd their root."""
    monkeypatch.chdir(tmp_path)
    for seed, relative in enumerate(("code/train", "docs/train", "docs/web")):
        _write(tmp_path / relative, 60, seed)
    return tmp_path


def test_the_three_forms_and_pasted_strings_parse_alike(files):
    """Bug: the words read differently as several arguments than as one pasted string, the
    weighted form taken for prefixes (or the reverse), or a dataset named by its folder."""
    weighted = data_args(["0.3", "code/train", "0.7", "docs/web"])
    assert weighted == data_args("0.3 code/train  0.7\tdocs/web")
    assert [(s.name, s.prefix, s.weight) for s in weighted.blend] == [
        ("train", "code/train", 0.3), ("web", "docs/web", 0.7)]
    plain = data_args(["code/train docs/web"])
    assert [(s.name, s.weight) for s in plain.blend] == [("train", None), ("web", None)]
    assert not plain.weighted and weighted.weighted
    (files / "mix.txt").write_text("0.3 code/train\n0.7 docs/web\n")
    assert data_args(data_args_path="mix.txt").blend == weighted.blend
    assert weighted.default_cache_dir() == Path("code/.index")


def test_equal_stems_are_named_by_their_folders():
    """Bug: two prefixes of the same stem (code/train, docs/train) given one name, so that one
    overwrote the other in the blend, the weights and the cache."""
    names = dataset_names(["/d/code/train", "/d/docs/train", "/d/docs/web", "/x/a/s", "/y/a/s"])
    assert list(names.values()) == ["code/train", "docs/train", "web", "x/a/s", "y/a/s"]


def test_per_split_file_shares_names_across_splits(files):
    """Bug: a prefix listed by two splits named differently in each (two cache entries and
    report rows for one file), or a missing valid/test taken for an error."""
    (files / "splits.json").write_text(json.dumps({
        "train": "0.5 code/train 0.5 docs/train", "valid": ["docs/train"], "test": None}))
    args = data_args(per_split_data_args_path="splits.json")
    assert list(args.per_split) == ["train", "valid"]
    assert [s.name for s in args.per_split["train"]] == ["code/train", "docs/train"]
    assert [s.name for s in args.per_split["valid"]] == ["docs/train"]


def test_argv_words_become_repeated_options():
    """Bug: Megatron's `--data-path W1 P1 W2 P2` (argparse nargs='*') cut after its first
    word by click, or an option after it swallowed."""
    assert expand_data_path_argv(["build-index", "--data-path", "0.3", "a", "0.7", "b",
                                  "--seq-length", "8"]) == [
        "build-index", "--data-path", "0.3", "--data-path", "a", "--data-path", "0.7",
        "--data-path", "b", "--seq-length", "8"]
    assert expand_data_path_argv(["--data-path=0.3", "a", "0.7", "b", "-h"]) == [
        "--data-path", "0.3", "--data-path", "a", "--data-path", "0.7", "--data-path", "b",
        "-h"]


def test_prefixes_made_absolute_keep_their_weights(tmp_path):
    """Bug: a saved config whose relative prefixes point elsewhere from another folder, or a
    weight taken for a path and made absolute."""
    assert absolute_data_path("0.3 a/x 0.7 /b/y", tmp_path) == [
        "0.3", str(tmp_path / "a/x"), "0.7", "/b/y"]


def test_data_path_build_blends_two_folders(files, dataprep):
    """Bug: build-index refuses --data-path, needs a folder, or names the datasets otherwise
    than their stems (folder and stem where stems are equal)."""
    code, out, err = dataprep("build-index", "--data-path", "0.3", "code/train", "0.7",
                              "docs/train", "--seq-length", "8", "--train-samples", "50",
                              "--split", "90,10,0", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["datasets"] == {"code/train": "code/train", "docs/train": "docs/train"}
    assert report["cache_dir"] == "code/.index"
    assert report["splits"]["train"]["samples"] == 50
    code, out, err = dataprep("build-index", "--data-path", "code/train", "--data-cache-path",
                              "cache", "--seq-length", "8", "--train-samples", "5", "--split",
                              "1", "--json")
    assert code == 0, err
    assert json.loads(out)["cache_dir"] == "cache"


@pytest.mark.parametrize(("args", "expected"), [
    (["--data-path", "0.3", "code/train", "0.7"],
     "error: --data-path: 3 items, an odd count: the weighted form is pairs"),
    (["--data-path", "0.3", "code/train", "0.7", "nowhere/x"],
     "error: --data-path: nowhere/x: no nowhere/x.idx"),
    (["--data-path", "0.3", "code/train", "lots", "docs/web"],
     "error: --data-path: item 3 'lots': not a number"),
    (["--data-path", "0.3", "code/train", "-1", "docs/web"],
     "error: --data-path: item 3 '-1': a weight must be a finite number >= 0"),
    (["code", "--data-path", "code/train"],
     "error: CORPUS_DIR code and --data-path: give one of them"),
    ([], "error: CORPUS_DIR not given: give a folder of NAME.bin/.idx, or the datasets' "
         "prefixes with --data-path"),
    (["--data-path", "code/train", "--data-args-path", "mix.txt"],
     "error: --data-path and --data-args-path: give one of them"),
    (["--per-split-data-args-path", "nofile.json"],
     "error: --per-split-data-args-path nofile.json: cannot read it"),
    (["--per-split-data-args-path", "valid.json"],
     'error: --per-split-data-args-path valid.json: no "train" datasets'),
    (["--per-split-data-args-path", "split.json", "--split", "9,1"],
     "error: --split 9,1 and --per-split-data-args-path: each split's datasets are used whole"),
    (["--data-path", "0.5 code/train 0.5 docs/web", "--weight", "web=1"],
     "error: --weight and --data-path: give the weights in one place"),
])
def test_bad_data_arguments_are_one_line_naming_the_argument(files, dataprep, args,
                                                             expected):
    """Bug: a traceback, or a line that does not say which argument (and which item of it)
    is wrong, for the mistakes Megatron users make with its data arguments; an index built
    anyway."""
    (files / "valid.json").write_text(json.dumps({"valid": ["docs/web"]}))
    (files / "split.json").write_text(json.dumps({"train": ["docs/web"]}))
    code, out, err = dataprep("build-index", *args, "--seq-length", "8", "--train-samples", "5")
    assert code == 1 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(expected), err
    assert not list(files.rglob(".index"))
