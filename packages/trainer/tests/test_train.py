"""The training loop end to end on a tiny corpus: exact resume, skipped bad steps, the
metrics it writes, its errors."""

from __future__ import annotations

import json

import pytest
import torch

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint import latest_checkpoint
from bloomline.trainer.kernels.cpu import linear
from bloomline.trainer.loop import Trainer


def _records(run_dir, kind="train"):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _run(cfg):
    return Trainer(cfg, log=lambda line: None).run()


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("matmul", ["aten", "onednn"])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(corpus, tmp_path, make_config,
                                                             matmul):
    """Catches: any state a resume loses or re-draws (optimizer moments and step, LR position,
    the sampler's place, RNG states, the loss scaler): 20 steps straight and 10 + resume + 10
    must give bitwise-equal losses in fp32 on CPU, on either fp32 matmul backend (the one
    ``auto`` does not pick on this CPU runs too)."""
    if matmul == "onednn" and not linear.onednn_available():
        pytest.skip("torch without oneDNN's linear op")
    before = linear.onednn_linear_enabled()
    try:
        _straight_and_resumed(corpus, tmp_path, make_config, matmul)
    finally:
        linear.set_onednn_linear(before)


def _straight_and_resumed(corpus, tmp_path, make_config, matmul: str) -> None:
    straight = make_config(corpus, tmp_path / "a",
                           train={"log_interval": 1, "cpu_fp32_matmul": matmul})
    _run(straight)
    split = make_config(corpus, tmp_path / "b", train={"log_interval": 1, "exit_interval": 10,
                                                       "cpu_fp32_matmul": matmul})
    state = _run(split)
    assert state.step == 10 and latest_checkpoint(tmp_path / "b").name == "step_00000010"
    split.train.exit_interval = 0
    _run(split)  # checkpoint.resume = auto
    losses_a = [r["loss"] for r in _records(tmp_path / "a")]
    losses_b = [r["loss"] for r in _records(tmp_path / "b")]
    assert len(losses_a) == 20 and losses_b == losses_a


@pytest.mark.slow
def test_bf16_run_learns_and_writes_every_metric(corpus, tmp_path, make_config):
    """Catches: a bf16 policy that does not train (loss flat), or a log record missing a
    metric the monitoring promises (MFU, memory, loss scale, activation stats)."""
    cfg = make_config(corpus, tmp_path / "run", precision={"dtype": "bf16"},
                      monitor={"activation_stats_interval": 10, "tensorboard": True},
                      train={"log_interval": 2, "eval_interval": 10, "eval_samples": 8})
    _run(cfg)
    records = _records(tmp_path / "run")
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    for key in ("lr", "grad_norm", "tokens_per_s", "samples_per_s", "mfu", "memory_gb",
                "seq_length", "global_batch_size", "skipped_steps"):
        assert key in records[-1]
    assert 0 < records[-1]["mfu"] < 1
    stats = _records(tmp_path / "run", "activation_stats")
    assert len(stats) == 2 and len(stats[0]["max_attention_logit"]) == 2
    assert all(v > 0 for v in stats[0]["grad_norm"] + stats[0]["max_residual"])
    assert _records(tmp_path / "run", "valid")[0]["valid_loss"] > 0
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    assert (tmp_path / "run" / "config.toml").is_file()


def test_non_finite_steps_are_skipped_then_the_run_stops(corpus, tmp_path, make_config):
    """Catches: a NaN loss silently applied to the weights, or a diverged run that keeps
    burning compute: each bad step is skipped and counted; too many in a row stop the run."""
    cfg = make_config(corpus, tmp_path / "run", train={"max_bad_steps": 3})
    trainer = Trainer(cfg, log=lambda line: None)
    with torch.no_grad():
        trainer.model.ln_f.weight.fill_(float("nan"))
    before = trainer.model.h["0"].mlp.dense_h_to_4h.weight.clone()
    with pytest.raises(UserError, match="4 consecutive steps with a non-finite loss"):
        trainer.run()
    assert trainer.state.skipped_steps == 4
    assert torch.equal(trainer.model.h["0"].mlp.dense_h_to_4h.weight, before)


@pytest.mark.slow
def test_curriculum_shortens_early_samples_and_ramps_the_batch(corpus, tmp_path, make_config):
    """Catches: curriculum settings that do not reach the batches actually trained (the
    logged sequence length and batch size are what the step ran)."""
    cfg = make_config(corpus, tmp_path / "run",
                      curriculum={"seqlen_warmup": True, "start_seq_length": 8,
                                  "seq_length_step": 8, "warmup_tokens": 300},
                      train={"log_interval": 1, "rampup_batch_size": [2, 2, 20],
                             "global_batch_size": 4, "train_samples": 60})
    _run(cfg)
    records = _records(tmp_path / "run")
    assert records[0]["seq_length"] == 8 and records[0]["global_batch_size"] == 2
    assert records[-1]["seq_length"] == 32 and records[-1]["global_batch_size"] == 4
    lengths = [r["seq_length"] for r in records]
    assert lengths == sorted(lengths)
    assert records[-1]["consumed_tokens"] == sum(r["seq_length"] * r["global_batch_size"]
                                                 for r in records)


def test_data_vocabulary_larger_than_the_model_is_refused(corpus, tmp_path, make_config):
    """Catches: ids past the embedding (an index error deep in a worker, or silent garbage
    on GPU)."""
    cfg = make_config(corpus, tmp_path / "run")
    cfg.model.vocab_size = 64  # the corpus uses ids up to 95
    with pytest.raises(UserError, match="is >= model.vocab_size 64"):
        _run(cfg)


def test_sequence_length_the_corpus_cannot_fill_names_the_field(corpus, tmp_path,
                                                                make_config):
    """Bug: a sequence length longer than the train split's tokens (no index can be built for
    it) fails deep in the index builder, or names dataprep's --seq-length flag instead of the
    trainer's field, or leaves a half-built index behind."""
    cfg = make_config(corpus, tmp_path / "run", data={"seq_length": 20000})
    with pytest.raises(UserError, match=r"too few for one sample of 20001; lower "
                                        r"data.seq_length"):
        _run(cfg)
    leftovers = list((tmp_path / "corpus" / ".index").rglob("*partial*"))
    assert not leftovers, leftovers


def test_missing_corpus_and_incompatible_checkpoint_name_the_field(corpus, tmp_path, make_config):
    """Catches: a resume that loads weights of another shape (a cryptic size mismatch) and a
    run started without data."""
    with pytest.raises(UserError, match="data.corpus"):
        _run(make_config("", tmp_path / "x"))
    cfg = make_config(corpus, tmp_path / "run", train={"exit_interval": 2})
    _run(cfg)
    cfg.model.hidden_size = 64
    with pytest.raises(UserError, match=r"incompatible config: model.hidden_size 32 -> 64"):
        _run(cfg)


@pytest.mark.slow
def test_checkpoints_are_pruned_to_keep_last(corpus, tmp_path, make_config):
    """Catches: checkpoints piling up until the disk is full, or a partial folder left."""
    cfg = make_config(corpus, tmp_path / "run", checkpoint={"interval": 4, "keep_last": 2})
    _run(cfg)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_00000016", "step_00000020"]
