"""Megatron's data arguments in the trainer's data section: data.data_path (a list or one
string), data.data_args_path, data.per_split_data_args_path, their rules and a run on them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.errors import UserError
from bloomline.dataprep import IndexRequest, build_sample_datasets, data_args
from bloomline.trainer.config import load_trainer_config
from bloomline.trainer.config_rules import validate
from bloomline.trainer.data import open_splits
from bloomline.trainer.data.data_source import data_source
from bloomline.trainer.evaluate_command import evaluate_checkpoint
from bloomline.trainer.loop import Trainer


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    """Two token files of one stem (``toy``) in two folders."""
    root = tmp_path_factory.mktemp("data")
    code = write_corpus(root / "code", documents=90, seed=1)
    docs = write_corpus(root / "docs", documents=60, seed=2)
    return f"{code}/toy", f"{docs}/toy"


@pytest.mark.slow
def test_run_trains_on_a_weighted_data_path_over_two_folders(tmp_path, folders):
    """Bug: the trainer needs data.corpus (a folder), reads other samples than build-index
    for the same words, loses the dataset names (equal stems: code/toy, docs/toy) in its
    per-dataset validation, saves relative prefixes that break a resume elsewhere, or
    `trainer evaluate` of its checkpoint looks for a corpus folder the run never had."""
    code, docs = folders
    cfg = tiny_config("", tmp_path / "run", train={"eval_interval": 10, "eval_samples": 4,
                                                   "train_samples": 40})
    cfg.data.data_path = ["0.25", code, "0.75", docs]
    Trainer(cfg, log=lambda *_: None).run()
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text()
               .splitlines()]
    valid = [r for r in records if r["kind"] == "valid"][-1]
    assert {"valid_loss/code/toy", "valid_loss/docs/toy"} <= set(valid)
    saved = tomllib.loads((tmp_path / "run/config.toml").read_text())["data"]
    assert saved["data_path"] == ["0.25", code, "0.75", docs]
    assert (Path(code).parent / ".index").is_dir()  # beside the first prefix
    # trainer evaluate reads the run's own valid split through the same arguments
    result, step, scored = evaluate_checkpoint(tmp_path / "run/checkpoints/step_00000010")
    assert step == 10 and scored.split == "valid" and "--data-path 0.25" in scored.note
    assert result.record() == pytest.approx(
        {k: v for k, v in valid.items() if k.startswith("valid_")}, rel=1e-4)
    # the same samples as build-index's for the same words
    request = IndexRequest(seq_length=32, train_samples=40, split="90,10,0")
    ours = build_sample_datasets(data_args(f"0.25 {code} 0.75 {docs}"), request).splits
    theirs = open_splits(data_source(cfg.data), 32, 40, None, "90,10,0", 1234, {})
    for i in range(40):
        np.testing.assert_array_equal(theirs["train"].samples[i], ours["train"][i])


def test_string_and_list_forms_load_alike(tmp_path, folders, monkeypatch):
    """Bug: data.data_path pasted as one string refused (or split otherwise than the list),
    or its relative prefixes left relative to a folder the run may not start in."""
    monkeypatch.chdir(Path(folders[0]).parent.parent)
    as_string = load_trainer_config(None, ['data.data_path="0.3 code/toy 0.7 docs/toy"'])
    as_list = load_trainer_config(None, ['data.data_path=["0.3", "code/toy", "0.7", '
                                         '"docs/toy"]'])
    assert as_string.data.data_path == as_list.data.data_path == [
        "0.3", folders[0], "0.7", folders[1]]


@pytest.mark.parametrize(("settings", "expected"), [
    ({"corpus": "/x", "data_path": ["a"]}, "data.corpus /x and data.data_path: give one of them"),
    ({"data_path": ["0.5", "a", "0.5", "b"], "weights": {"a": 1.0}},
     "data.weights and data.data_path: give the weights in one place"),
    ({"per_split_data_args_path": "/s.json", "split": "90,10,0"},
     "data.split 90,10,0 and data.per_split_data_args_path: each split's datasets are used "
     "whole"),
    ({"data_path": ["0.5", "a", "0.5"]}, "data.data_path: 3 items, an odd count"),
    ({"data_path": ["0.5", "a", "x", "b"]}, "data.data_path: item 3 'x': not a number"),
    ({"data_path": ["a"], "data_args_path": "/f"},
     "data.data_path and data.data_args_path: give one of them"),
])
def test_conflicting_data_settings_are_one_line_naming_the_keys(tmp_path, settings, expected):
    """Bug: two sources of data (or weights given twice, a split beside a per-split file, a
    malformed data_path) accepted with one silently winning, or refused in dataprep's flag
    names instead of the trainer's keys."""
    cfg = tiny_config("", tmp_path / "run")
    for key, value in settings.items():
        setattr(cfg.data, key, value)
    with pytest.raises(UserError) as err:
        validate(cfg)
    assert str(err.value).startswith(expected), str(err.value)
    assert "\n" not in str(err.value)


def test_missing_prefix_and_per_split_file_named_by_key(tmp_path, folders):
    """Bug: a missing token file or a per-split file without "train" reaches the run as a
    traceback or in dataprep's flag names."""
    cfg = tiny_config("", tmp_path / "run")
    cfg.data.data_path = [folders[0], str(tmp_path / "gone")]
    with pytest.raises(UserError, match=r"^data.data_path: .*gone: no .*gone.idx$"):
        data_source(cfg.data)
    (tmp_path / "splits.json").write_text(json.dumps({"valid": [folders[0]]}))
    cfg.data.data_path, cfg.data.per_split_data_args_path = [], str(tmp_path / "splits.json")
    with pytest.raises(UserError, match=r'^data.per_split_data_args_path .*: no "train"'):
        data_source(cfg.data)


def test_per_split_file_gives_each_split_its_own_datasets_whole(tmp_path, folders):
    """Bug: the trainer cuts a per-split file's datasets by data.split (valid would then see
    a few percent of its file, train would train on part of the valid file's documents), or
    refuses the default data.split beside it."""
    code, docs = folders
    (tmp_path / "splits.json").write_text(json.dumps({"train": f"0.5 {code} 0.5 {docs}",
                                                      "valid": [docs]}))
    cfg = tiny_config("", tmp_path / "run", data={"split": "969,30,1"})
    cfg.data.per_split_data_args_path = str(tmp_path / "splits.json")
    validate(cfg)  # data.split at its default: accepted, not used
    splits = open_splits(data_source(cfg.data), 32, 40, None, cfg.data.split, 1234, {})
    assert set(splits) == {"train", "valid"}
    whole = build_sample_datasets(data_args(docs), IndexRequest(
        seq_length=32, train_samples=None, split="1")).splits["train"]
    assert len(splits["valid"]) == len(whole)  # the whole file, one epoch
    assert splits["train"].samples.names == ["code/toy", "docs/toy"]
