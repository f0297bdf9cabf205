"""The trainer's commands end to end, as a user runs them after dataprep: pretrain, generate,
export-hf and a run that starts from the export (``checkpoint.init_from``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}"
    return done.stdout


TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4",
        "data.seq_length=32", "data.split=90,10,0", "data.num_workers=0",
        "train.micro_batch_size=4", "train.global_batch_size=8", "train.train_samples=160",
        "train.log_interval=5", "train.eval_interval=10", "train.eval_samples=8",
        "train.device=cpu", "precision.dtype=fp32", "optimizer.lr=3e-3", "schedule.warmup=16",
        "checkpoint.interval=0", "monitor.tensorboard=false", "monitor.activation_stats_interval=0",
        "monitor.peak_flops=1e12"]  # no start-up matmul timing: MFU is not read here


@pytest.mark.compat
@pytest.mark.slow
def test_pretrain_generate_export_and_continue_from_the_command_line(tmp_path):
    """Bug: a command that works from Python but not from the CLI (argument parsing, defaults,
    the checkpoint layout the next command expects), or an import whose run cannot train."""
    _run(BIN / "dataprep", "demo-corpus", "raw", "--size-mb", "0.3", cwd=tmp_path)
    _run(BIN / "dataprep", "train-tokenizer", "raw", "--vocab-size", "400", "--output",
         "tok/demo", cwd=tmp_path)
    _run(BIN / "dataprep", "tokenize", "raw", "--tokenizer", "tok/demo.model", "--output",
         "corpus/demo", cwd=tmp_path)
    data = ["data.corpus=corpus", "data.tokenizer=tok/demo.model"]
    out = _run(BIN / "trainer", "pretrain", *TINY, *data, "train.run_dir=run", cwd=tmp_path)
    assert "step 20/20" in out and "valid loss" in out
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < losses[0]
    checkpoint = tmp_path / "run/checkpoints/step_00000020"
    assert checkpoint.is_dir()

    text = _run(BIN / "trainer", "generate", checkpoint, "--prompt", "The ",
                "--max-new-tokens", "8", cwd=tmp_path)
    # 8 greedy tokens follow the prompt (a barely trained model may pick spaces)
    assert text.startswith("The ") and len(text.rstrip("\n")) > len("The ")
    from bloomline.dataprep.tokenizer import load_tokenizer
    from bloomline.trainer.generate import continuation_text

    # the continuation's first word keeps its space: "The history of" + " the", not "ofthe"
    tok = load_tokenizer(str(tmp_path / "tok/demo.model"))
    prompt_ids, new_ids = ([int(i) for i in ids] for ids in
                           tok.encode_batch(["The history of", "the world"]))
    assert continuation_text(tok, prompt_ids, new_ids) == " the world"
    sampled = _run(BIN / "trainer", "generate", checkpoint, "--prompt", "The ",
                   "--max-new-tokens", "8", "--temperature", "1.0", "--top-k", "20",
                   "--top-p", "0.9", cwd=tmp_path)
    assert sampled.startswith("The ")

    _run(BIN / "trainer", "export-hf", checkpoint, "hf", cwd=tmp_path)
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["n_layer"] == 2 and (tmp_path / "hf/model.safetensors").is_file()

    # continued pretraining from the export, as the README's "Start from a model" runs it
    out = _run(BIN / "trainer", "pretrain", *TINY, *data, "train.run_dir=continued",
               "checkpoint.init_from=hf", "train.train_samples=40", cwd=tmp_path)
    # the path as the run resolved it (absolute: the run folder is usable from anywhere)
    assert f"weights from {tmp_path / 'hf'} (hf), optimizer fresh, step 0" in out
    assert "step 5/5" in out
    first = json.loads((tmp_path / "continued/metrics.jsonl").open().readline())
    # starts from the trained weights, not from a fresh init (whose loss is ~ln(512) = 6.2)
    assert first["loss"] < losses[0] - 0.3
