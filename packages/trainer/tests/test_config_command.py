"""The config a user can see: ``trainer config`` (the resolved config, ``--doc``), the
suggestions for unknown keys, ``data.weights`` overrides and absolute paths."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bloomline.common.config_loader import describe_keys, load_config
from bloomline.common.errors import UserError
from bloomline.trainer.cli import app
from bloomline.trainer.config import Config, load_trainer_config
from bloomline.trainer.run_spec import load_run

RECIPE = Path(__file__).parents[3] / "configs" / "tiny-cpu.toml"


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _leaf_names() -> set[str]:
    return {row["key"].rpartition(".")[2] for row in describe_keys(Config)}


@pytest.mark.parametrize(("typo", "suggested"), [
    ("optimizer.learning_rate", "optimizer.lr"),
    ("learning_rate", "optimizer.lr"),
    ("train.batch_size", "train.micro_batch_size or train.global_batch_size"),
    ("data.seq_len", "data.seq_length"),
    ("optimizer.lr_min", "optimizer.min_lr"),
    ("checkpoint.save_interval", "checkpoint.interval"),
    ("lr", "optimizer.lr"),
    ("optim.lr", "optimizer.lr"),
    ("trian.train_samples", "train.train_samples"),
    ("model.num_layer", "model.num_layers"),
    ("model.n_head", "model.num_heads"),
    ("optimizer.weight_decy", "optimizer.weight_decay"),
    ("train.warmup", "schedule.warmup"),
])
def test_unknown_keys_suggest_the_key_meant(typo, suggested):
    """Bug: the suggestion matched on the last component alone (optimizer.learning_rate ->
    optimizer.min_lr, because 'lr' is spelled inside 'min_lr'), or other toolkits' names
    (batch_size, seq_len, n_head) got no suggestion or a wrong one."""
    with pytest.raises(UserError) as info:
        load_trainer_config(None, [f"{typo}=1"])
    assert str(info.value).endswith(f"unknown config key {typo}; did you mean {suggested}?")


def test_a_key_close_to_nothing_gets_no_guess():
    """Bug: a guess for any input, however far (a wrong hint is worse than none)."""
    with pytest.raises(UserError) as info:
        load_trainer_config(None, ["zzzz.qqqq=1"])
    assert "did you mean" not in str(info.value)


def test_every_synonym_points_at_a_real_field():
    """Bug: a synonym table entry naming a field that was renamed or never existed (its
    suggestion would name a key that is itself unknown)."""
    leaves = _leaf_names()
    for name, targets in Config.KEY_SYNONYMS.items():
        assert name not in leaves, f"{name} is a real field, not a synonym"
        assert set(targets) <= leaves, f"{name} -> {targets}"


def test_weights_given_per_dataset_add_up(tmp_path):
    """Bug: data.weights.a=1 data.weights.b=2 kept only b (each override replaced the whole
    table); or an entry replaced the recipe's table instead of adding to it; or the inline
    table form stopped replacing it."""
    cfg = load_config(Config, None, ["data.weights.wiki=0.3", "data.weights.code=0.7"])
    assert cfg.data.weights == {"wiki": 0.3, "code": 0.7}
    recipe = tmp_path / "r.toml"
    recipe.write_text("[data.weights]\nwiki = 1\nweb = 2\n")
    cfg = load_config(Config, recipe, ["data.weights.code=3", "data.weights.wiki=4"])
    assert cfg.data.weights == {"wiki": 4.0, "web": 2.0, "code": 3.0}
    cfg = load_config(Config, recipe, ["data.weights={code = 1, web = 5}"])
    assert cfg.data.weights == {"code": 1.0, "web": 5.0}
    with pytest.raises(UserError, match=r"data.weights.code = -1: must be >= 0"):
        load_config(Config, recipe, ["data.weights.code=-1"])


def test_a_weight_for_a_dataset_the_corpus_lacks_names_the_trainer_key(corpus):
    """Bug: the trainer's error named dataprep's --weight flag, which the trainer has not."""
    from bloomline.trainer.data import open_splits

    with pytest.raises(UserError) as info:
        open_splits(corpus, 32, 8, None, "90,10,0", 1, {"toy": 1.0, "wiki": 1.0})
    message = str(info.value)
    assert message.startswith("data.weights.wiki: no dataset 'wiki'") and "--weight" not in message


def test_every_key_is_documented():
    """Bug: a field added without a docstring: --doc would list it with no explanation."""
    undocumented = [row["key"] for row in describe_keys(Config) if not row["doc"]]
    assert undocumented == []


def test_config_prints_what_pretrain_would_run(tmp_path, monkeypatch):
    """Bug: `trainer config` printing something else than pretrain runs (defaults missing,
    overrides or renames not applied, relative paths), or not readable back as a recipe."""
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(RECIPE), "optimizer.lr=1e-3", "data.corpus=somewhere/corpus",
            "monitor.thermometer_interval=7"]
    result = _invoke("config", *args)
    assert result.exit_code == 0, result.output
    printed = tomllib.loads(result.stdout)
    assert printed["optimizer"]["lr"] == 1e-3
    assert printed["monitor"]["activation_stats_interval"] == 7
    assert printed["data"]["corpus"] == str(tmp_path / "somewhere" / "corpus")
    assert printed["spike"]["window"] == 100  # a default the recipe does not set
    (tmp_path / "printed.toml").write_text(result.stdout)
    expected = load_run(RECIPE, args[2:], check_tokenizer=False).config  # what pretrain runs
    assert load_trainer_config(tmp_path / "printed.toml") == expected
    as_json = json.loads(_invoke("config", *args, "--json").stdout)
    assert as_json == printed


def test_config_refuses_a_bad_key_as_pretrain_does():
    """Bug: `trainer config` accepting what pretrain refuses, or with another message."""
    result = _invoke("config", "optimizer.learning_rate=1e-3")
    assert result.exit_code != 0
    assert "unknown config key optimizer.learning_rate; did you mean optimizer.lr?" in str(
        result.exception)


def test_doc_lists_every_key_with_type_default_range_and_doc():
    """Bug: a key missing from --doc, or its range/default not the declared ones."""
    text = _invoke("config", "--doc").stdout
    for row in describe_keys(Config):
        assert f"\n{row['key']}: {row['type']} = " in "\n" + text, row["key"]
    assert 'optimizer.lr: float = 0.0003  (> 0)\n    Peak learning rate.' in text
    assert "checkpoint.async: bool = false" in text  # the key a recipe writes, not async_
    assert "data.corpus: path = " in text
    rows = json.loads(_invoke("config", "--doc", "--json").stdout)
    assert [row["key"] for row in rows] == [row["key"] for row in describe_keys(Config)]
    tuned = _invoke("config", "--doc", "model.hidden_size=96").stdout
    assert "model.hidden_size: int = 96  (default 768; >= 1)" in tuned


def test_paths_are_made_absolute_and_names_are_kept(tmp_path, monkeypatch):
    """Bug: relative paths saved into the run folder (the run then only works from the folder
    it was started in), or words and names (auto, tiktoken:NAME) turned into paths."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok.model").write_bytes(b"")
    cfg = load_trainer_config(None, ["data.corpus=c", "data.tokenizer=tok.model",
                                     "train.run_dir=runs/x", "checkpoint.init_from=",
                                     "checkpoint.resume=none"])
    assert cfg.data.corpus == str(tmp_path / "c")
    assert cfg.data.tokenizer == str(tmp_path / "tok.model")
    assert cfg.train.run_dir == str(tmp_path / "runs" / "x")
    assert cfg.checkpoint.resume == "none" and cfg.checkpoint.init_from == ""
    named = load_trainer_config(None, ["data.tokenizer=tiktoken:gpt2"])
    assert named.data.tokenizer == "tiktoken:gpt2" and named.checkpoint.resume == "auto"


def test_the_config_schema_loads_no_torch():
    """Bug: importing the config schema pulling in torch and the distributed checkpoint
    (seconds) through a chain of imports (config -> model_source -> checkpoint), so that every
    tool that only reads or checks a recipe pays for torch."""
    import subprocess
    import sys

    code = ("import sys, bloomline.trainer.config; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out
