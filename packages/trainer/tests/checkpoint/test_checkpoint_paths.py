"""Every command that takes a checkpoint path says what a wrong one really is (missing, with
the steps its run still has; a run folder, with its checkpoints; a transformers export, with
what to do with it), the reading commands take a run folder for its latest checkpoint, and a
run started where its checkpoint is at or past the config's end says so, then its summary.
One 3-step run (checkpoints of steps 2 and 3 kept, step 1 deleted by checkpoint.keep_last)
and its export serve every case."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.dataprep import tokenize_corpus
from bloomline.trainer.cli import app

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

TINY = ["model.vocab_size=0", "model.hidden_size=32", "model.num_layers=2",
        "model.num_heads=4", "data.seq_length=32", "data.split=90,10,0", "data.num_workers=0",
        "train.micro_batch_size=2", "train.global_batch_size=4", "train.eval_interval=0",
        "train.eval_samples=4", "train.device=cpu", "precision.dtype=fp32",
        "schedule.warmup=0", "optimizer.min_lr=0", "monitor.tensorboard=false",
        "monitor.peak_flops=1e12", "monitor.activation_stats_interval=0",
        "watchdog.enabled=false"]
TEXTS = [f"Document {i}: the quick brown fox jumps over the lazy dog. " * (2 + i % 4)
         for i in range(40)]


def _invoke(*args):
    """``trainer ARGS`` in this process: (exit code, output, the UserError's line or None)."""
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    if result.exception is not None and not isinstance(result.exception, UserError):
        raise result.exception
    error = str(result.exception) if isinstance(result.exception, UserError) else None
    return result.exit_code, result.output, error


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_tokenizer):
    """tmp/run (steps 2 and 3 kept of 1-3), tmp/hf (its export), the corpus and settings."""
    root = tmp_path_factory.mktemp("paths")
    source = root / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    tokenize_corpus([str(source)], str(tiny_tokenizer), str(root / "corpus" / "docs"),
                    show_progress=False)
    settings = [*TINY, f"data.corpus={root / 'corpus'}", f"data.tokenizer={tiny_tokenizer}"]
    code, output, error = _invoke("pretrain", *settings, f"train.run_dir={root / 'run'}",
                                  "train.train_samples=12", "checkpoint.interval=1",
                                  "checkpoint.keep_last=2")
    assert code == 0 and error is None, output
    code, output, error = _invoke("export-hf", root / "run" / "checkpoints" / "step_00000003",
                                  root / "hf")
    assert code == 0 and error is None, output
    return root, settings


def _refusal(*args) -> str:
    code, output, error = _invoke(*args)
    assert code == 1 and error is not None and "\n" not in error, (code, output)
    return error


def test_each_command_says_what_a_wrong_checkpoint_path_is(made):
    """Bug: a run folder given to generate, export-hf, evaluate or a resume said "damaged or
    incomplete checkpoint: manifest.json: missing"; a missing path, a checkpoint deleted by
    checkpoint.keep_last and a transformers export all said "not a bloomline checkpoint (no
    config.toml)": none said what the path was, which checkpoints exist or what to do."""
    root, settings = made
    run, hf, ckpts = root / "run", root / "hf", root / "run" / "checkpoints"
    steps = "step_00000002, step_00000003"
    deleted = (f"{ckpts / 'step_00000001'}: no such file or folder; {ckpts} has {steps} "
               "(checkpoint.keep_last = 2 keeps the newest 2: older ones are deleted")
    assert _refusal("generate", ckpts / "step_00000001", "--prompt", "x").startswith(deleted)
    assert _refusal("evaluate", root / "nowhere") == f"{root / 'nowhere'}: no such file or folder"
    hf_line = f"{hf} is a transformers (Hugging Face) model folder, not a bloomline checkpoint; "
    assert _refusal("generate", hf, "--prompt", "x") == (
        hf_line + f"to start a run from its weights use checkpoint.init_from={hf}")
    assert _refusal("export-hf", hf, root / "out").startswith(hf_line + "nothing to export")
    listed = (f"is a run folder; its checkpoints: {steps} (latest: step_00000003); give one "
              f"of them, e.g. {ckpts / 'step_00000003'}")
    assert _refusal("verify-checkpoint", run) == f"{run} {listed}"
    assert "holds no checkpoint of the format before manifests" in _refusal(
        "upgrade-checkpoint", run, root / "new")
    other = [*settings, f"train.run_dir={root / 'other'}"]
    assert _refusal("pretrain", *other, f"checkpoint.resume={run}") == (
        f"checkpoint.resume {run} {listed} (or, to continue that run, train.run_dir={run} "
        "--resume auto)")
    assert _refusal("pretrain", *other, f"checkpoint.resume={hf}") == (
        f"checkpoint.resume {hf_line}to start a run from its weights use "
        f"checkpoint.init_from={hf} instead of checkpoint.resume")
    assert _refusal("pretrain", *other, f"checkpoint.resume={ckpts / 'step_00000001'}") \
        .startswith(f"checkpoint.resume {deleted}")
    assert _refusal("pretrain", *other, f"checkpoint.init_from={ckpts}").startswith(
        f"checkpoint.init_from {ckpts} is a run's checkpoints folder; its checkpoints: {steps}")
    # a damaged checkpoint keeps the manifest's own message
    damaged = root / "damaged"
    shutil.copytree(ckpts / "step_00000003", damaged)
    (damaged / "manifest.json").unlink()
    assert _refusal("generate", damaged, "--prompt", "x").startswith(
        f"{damaged}: damaged or incomplete checkpoint: manifest.json: missing")


def test_reading_commands_take_a_run_folder_for_its_latest_checkpoint(made):
    """Bug: `trainer generate runs/tiny-cpu` (the run folder, as Megatron's --load takes it)
    was refused as a damaged checkpoint; generate, export-hf and evaluate must use the run's
    latest checkpoint and say which."""
    root, _ = made
    run, latest = root / "run", root / "run" / "checkpoints" / "step_00000003"
    code, output, _ = _invoke("generate", run, "--prompt", "the", "--max-new-tokens", "2")
    assert code == 0 and f"{run} is a run folder: using its latest checkpoint, {latest}" in output
    code, output, _ = _invoke("export-hf", run / "checkpoints", root / "hf2")
    assert code == 0 and (root / "hf2" / "model.safetensors").is_file(), output
    assert f"{run / 'checkpoints'} is a run's checkpoints folder: using its latest" in output
    code, output, _ = _invoke("evaluate", run, "--samples", "2")
    assert code == 0 and f"{run} (step 3)" in output, output


def test_a_larger_tokenizer_on_a_model_of_fixed_shape_gets_advice_that_applies(
        made, bloom_like_tokenizer):
    """Bug: after checkpoint.init_from (or on resume) a larger tokenizer was told to "raise
    model.vocab_size (or set it to 0 ...)", which the source's shape forbids: the advice must
    be a tokenizer that fits, with both sizes and the source's own tokenizer."""
    root, settings = made
    # model.vocab_size not given: an override would contradict the source's (its own error)
    big = [*settings[1:], f"data.tokenizer={bloom_like_tokenizer}"]
    line = _refusal("pretrain", *big, f"train.run_dir={root / 'other'}",
                    f"checkpoint.init_from={root / 'hf'}")
    assert "vocabulary of 65796 tokens is larger than the model's 512 embedding rows; the " \
           f"model's shape comes from checkpoint.init_from {root / 'hf'}" in line, line
    assert (f"at most 512 tokens (the one it was trained with, data.tokenizer="
            f"{root / 'hf' / 'tokenizer.model'})") in line and "raise" not in line
    line = _refusal("pretrain", *big, "model.vocab_size=0", f"train.run_dir={root / 'run'}")
    assert "the checkpoint this run resumes" in line and "another train.run_dir" in line, line
    assert "raise" not in line


def test_a_run_at_or_past_this_configs_end_says_so_and_prints_its_summary(made):
    """Bug: re-running a recipe whose run was continued further refused with a skip-range
    error that did not apply (or, at its end exactly, printed "run complete: step N of N"
    and no summary): it must say the run is past this config's end, what to do, print the
    run's summary, and exit 0."""
    root, settings = made
    run = [*settings, f"train.run_dir={root / 'run'}"]
    code, output, error = _invoke("pretrain", *run, "train.train_samples=8")
    assert code == 0 and error is None, output
    assert (f"nothing to train: {root / 'run' / 'checkpoints' / 'step_00000003'} is at step 3 "
            "(12 samples), past this config's 2 steps (train.train_samples 8): the run was "
            "continued further; to train further, raise train.train_samples above 12; to "
            "start over, use another train.run_dir") in output
    assert "run completed: step 3 of 3" in output and f"summary: {root / 'run'}" in output
    code, output, _ = _invoke("pretrain", *run, "train.train_samples=12")
    assert code == 0 and "is at step 3, the end of this config's 3 steps" in output
    assert "run completed: step 3 of 3" in output, output
