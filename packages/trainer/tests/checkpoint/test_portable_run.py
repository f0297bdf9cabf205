"""A run folder and its checkpoints hold what they need to be used from anywhere: absolute
paths in their config, and their own copy of the tokenizer."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.dataprep import tokenize_corpus
from bloomline.trainer.checkpoint import write_manifest
from bloomline.trainer.cli import app
from bloomline.trainer.data.run_tokenizer import _load_tokenizer_cached

TINY = ["model.vocab_size=512", "model.hidden_size=32", "model.num_layers=2",
        "model.num_heads=4", "data.seq_length=32", "data.split=90,10,0", "data.num_workers=0",
        "train.micro_batch_size=2", "train.global_batch_size=4", "train.train_samples=8",
        "train.eval_interval=0", "train.eval_samples=4", "train.device=cpu",
        "precision.dtype=fp32", "schedule.warmup=0", "optimizer.min_lr=0",
        "checkpoint.interval=0", "monitor.tensorboard=false", "monitor.peak_flops=1e12",
        "monitor.activation_stats_interval=0", "watchdog.enabled=false"]
TEXTS = [f"Document {i}: the quick brown fox jumps over the lazy dog. " * (2 + i % 4)
         for i in range(40)]


def _invoke(*args: str):
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    if isinstance(result.exception, UserError):
        return result
    assert result.exit_code == 0, f"{args}: {result.output}{result.exception!r}"
    return result


@pytest.fixture
def trained(tmp_path, monkeypatch, tiny_tokenizer):
    """A 2-step run started from tmp_path with relative paths: tok/tiny.model (a copy of the
    session's SentencePiece model, so that a test may delete it), corpus/, run/."""
    (tmp_path / "tok").mkdir()
    shutil.copy(tiny_tokenizer, tmp_path / "tok" / "tiny.model")
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    tokenize_corpus([str(source)], str(tmp_path / "tok" / "tiny.model"),
                    str(tmp_path / "corpus" / "docs"), show_progress=False)
    monkeypatch.chdir(tmp_path)
    _invoke("pretrain", *TINY, "data.corpus=corpus", "data.tokenizer=tok/tiny.model",
            "train.run_dir=run")
    return tmp_path


def test_a_copied_checkpoint_works_without_the_original_tokenizer_and_corpus(trained,
                                                                              monkeypatch):
    """Bug: the saved config holds paths relative to where the run started, or a checkpoint
    needs the original tokenizer file: copied to another machine (or after the tokenizer was
    moved), generate/export-hf fail or use another tokenizer, and evaluate fails deep inside
    instead of saying the corpus is gone."""
    run, checkpoint = trained / "run", trained / "run" / "checkpoints" / "step_00000002"
    original = (trained / "tok" / "tiny.model").read_bytes()
    for folder in (run, checkpoint):
        assert (folder / "tokenizer" / "tiny.model").read_bytes() == original
        assert (folder / "tokenizer" / "tokenizer.json").is_file()
        saved = tomllib.loads((folder / "config.toml").read_text())
        # the original path, absolute: for the record
        assert saved["data"]["tokenizer"] == str(trained / "tok" / "tiny.model")
        assert saved["data"]["corpus"] == str(trained / "corpus")
    away = trained / "elsewhere"
    shutil.copytree(checkpoint, away / "ckpt")
    (trained / "tok").rename(trained / "tok_gone")
    (trained / "corpus").rename(trained / "corpus_moved")
    monkeypatch.chdir(away)

    assert _invoke("verify-checkpoint", "ckpt").stdout.startswith("ok: ckpt")
    text = _invoke("generate", "ckpt", "--prompt", "The quick", "--max-new-tokens", "4").stdout
    assert text.startswith("The quick")
    exported = _invoke("export-hf", "ckpt", "hf").stdout
    assert "sentencepiece tokenizer" in exported
    assert (away / "hf" / "tokenizer.model").read_bytes() == original
    gone = _invoke("evaluate", "ckpt", "--samples", "2")
    assert str(gone.exception) == (f"ckpt: its data.corpus {trained / 'corpus'} no longer "
                                   "exists; pass --data with the corpus folder (a copy of it)")
    table = _invoke("evaluate", "ckpt", "--samples", "2", "--data", "../corpus_moved").stdout
    assert "ckpt (step 2), valid split:" in table and "docs" in table


def test_a_checkpoint_without_a_copy_uses_the_original_tokenizer(trained, monkeypatch):
    """Bug: checkpoints written before the copy existed no longer load their tokenizer; or
    the copy is read although --tokenizer names another one."""
    checkpoint = trained / "run" / "checkpoints" / "step_00000002"
    shutil.rmtree(checkpoint / "tokenizer")  # as saved before the copy existed
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint, 2, is_writer=True)
    text = _invoke("generate", checkpoint, "--prompt", "The quick", "--max-new-tokens", "2")
    assert text.stdout.startswith("The quick")
    (trained / "tok" / "tiny.model").rename(trained / "tiny.model")
    # this process loaded it while training; a `trainer generate` process starts without
    _load_tokenizer_cached.cache_clear()
    missing = _invoke("generate", checkpoint, "--prompt", "The", "--max-new-tokens", "2")
    assert "tok/tiny.model: tokenizer not found" in str(missing.exception)
    given = _invoke("generate", checkpoint, "--prompt", "The", "--max-new-tokens", "2",
                    "--tokenizer", trained / "tiny.model")
    assert given.stdout.startswith("The")


def test_a_resume_of_an_older_checkpoint_does_not_list_its_relative_paths(tmp_path,
                                                                          monkeypatch):
    """Bug: every resume of a checkpoint saved with relative paths logging 'data.corpus corpus
    -> /abs/corpus' as a changed setting, hiding the real changes in the line."""
    from bloomline.trainer.checkpoint import changed_settings
    from bloomline.trainer.config import Config

    monkeypatch.chdir(tmp_path)
    saved, current = Config(), Config()
    saved.data.corpus, current.data.corpus = "corpus", str(tmp_path / "corpus")
    current.optimizer.lr = 1e-3
    assert changed_settings(saved, current) == ["optimizer.lr 0.0003 -> 0.001"]
    current.data.corpus = str(tmp_path / "other")
    moved = f"data.corpus '{tmp_path / 'corpus'}' -> '{tmp_path / 'other'}'"
    assert moved in changed_settings(saved, current)


@pytest.mark.parametrize("fixture", ["tiny_tokenizer", "tiny_byte_bpe", "tiny_tiktoken",
                                     "eos_named_in_tokenizer_config"])
def test_the_copy_loads_as_the_original_for_every_kind(fixture, request, tmp_path):
    """Bug: a copy that is not the tokenizer the run used: the export loaded instead of the
    SentencePiece model, a Hugging Face file copied without the tokenizer_config.json that
    names its EOD token, or a kind that gets no copy at all."""
    from bloomline.dataprep.tokenizer import load_tokenizer
    from bloomline.trainer.checkpoint import copied_tokenizer, tokenizer_copy_files
    from bloomline.trainer.config import DataConfig
    from bloomline.trainer.survival.run_folder import write_run_tokenizer

    if fixture == "eos_named_in_tokenizer_config":  # not the well-known </s>
        spec = str(shutil.copytree(request.getfixturevalue("tiny_byte_bpe"), tmp_path / "hf"))
        (tmp_path / "hf" / "tokenizer_config.json").write_text('{"eos_token": "<pad>"}')
    else:
        spec = str(request.getfixturevalue(fixture))
    write_run_tokenizer(tmp_path / "run", tokenizer_copy_files(DataConfig(tokenizer=spec)))
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()  # AutoTokenizer's
    original, copy = load_tokenizer(spec), load_tokenizer(copied_tokenizer(tmp_path / "run"))
    assert copy.kind == original.kind and copy.special_ids == original.special_ids
    if fixture == "eos_named_in_tokenizer_config":
        assert original.special_ids["eod"] == original.special_ids["pad"]
    texts = ["The quick brown fox.", "Привет, мир! 東京 👩‍💻"]
    assert [list(ids) for ids in copy.encode_batch(texts)] == [
        list(ids) for ids in original.encode_batch(texts)]
