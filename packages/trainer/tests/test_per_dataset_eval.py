"""Per-dataset evaluation (``evaluation.py``): each dataset's valid loss besides the blend's,
the per-source train loss from the blend's provenance, under dp, tp and pp, and
``trainer evaluate``.

One 2-dataset corpus for the module: ``code`` (random tokens: a high loss) and ``en`` (ramps:
learnable), split 80/10/10 so that there is a test split. One single-process run is the
reference (its checkpoint also feeds the CLI tests); dp2, tp2 and pp2 runs of the same config
must log the same per-dataset valid and per-source train losses: 1e-5 relative in fp32 (the
layouts sum in other orders; after 4 steps, with Adam's epsilon at 1e-6 as in
test_parallel_tp, the losses measured ~1e-7 apart in each layout).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_fixtures import tiny_config

from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.checkpoint.manifest import MANIFEST, write_manifest
from bloomline.trainer.data import TokenSamples, blend_of, open_splits, sample_sources
from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.local_processes import run_distributed

NAMES = ("code", "en")
RTOL = 1e-5
# 4 steps of 4 samples, per-source losses at steps 2 and 4, evaluations at 2 and 4 over 5
# samples (not a multiple of the micro-batch of 2: a remainder batch) of the blend and of each
# dataset
SECTIONS = {"data": {"split": "80,10,10"}, "optimizer": {"eps": 1e-6},
            "train": {"train_samples": 16, "log_interval": 2, "eval_interval": 2,
                      "eval_samples": 5}}


def _write_dataset(folder: Path, name: str, ramp: bool, seed: int, documents: int) -> None:
    rng = np.random.default_rng(seed)
    writer = IndexedDatasetWriter(folder / name, np.uint16)
    for _ in range(documents):
        length = int(rng.integers(20, 120))
        tokens = ((int(rng.integers(0, 95)) + np.arange(length)) % 95 if ramp
                  else rng.integers(0, 95, length))
        writer.add_document(np.append(tokens, 95).astype(np.uint16))
    writer.finalize()


@pytest.fixture(scope="module")
def blend_corpus(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("blend") / "corpus"
    folder.mkdir()
    _write_dataset(folder, "en", ramp=True, seed=0, documents=90)
    _write_dataset(folder, "code", ramp=False, seed=1, documents=50)
    return str(folder)


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _train_run(corpus: str, run_dir: str, parallel: dict) -> dict | None:
    """Train the module's config (on every rank of a layout); rank 0 returns its records."""
    cfg = tiny_config(corpus, run_dir, parallel=parallel, **SECTIONS)
    Trainer(cfg, log=lambda *_: None).run()
    if os.environ.get("RANK", "0") != "0":
        return None
    return {"train": _records(Path(run_dir), "train"), "valid": _records(Path(run_dir), "valid")}


@pytest.fixture(scope="module")
def reference(blend_corpus, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = _train_run(blend_corpus, str(run_dir), {})
    result["checkpoint"] = run_dir / "checkpoints" / "step_00000004"
    return result


def _trainer(corpus: str, tmp_path: Path) -> tuple[Trainer, dict]:
    cfg = tiny_config(corpus, tmp_path / "run", **SECTIONS)
    splits = open_splits(cfg.data.corpus, cfg.data.seq_length, cfg.train.train_samples, None,
                         cfg.data.split, cfg.data.seed, None)
    return Trainer(cfg, log=lambda *_: None), splits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_token_losses_are_each_tokens_cross_entropy(dtype):
    """Bug: the fused head + loss hands back row losses from the wrong chunk offsets (300 rows
    span 3 chunks at this vocabulary), unmasked ignored labels, or rows that disagree with the
    mean it returns (every per-sample and per-dataset loss is built from them)."""
    from bloomline.trainer.model.loss import linear_cross_entropy

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 100, 16, generator=generator).to(dtype)
    weight = torch.randn(4096, 16, generator=generator).to(dtype)  # 128 rows a chunk
    labels = torch.randint(0, 4096, (3, 100), generator=generator)
    labels[1, 7] = -100
    loss, tokens = linear_cross_entropy(hidden, weight, labels, token_losses=True)
    logits = (hidden @ weight.T).float()
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                             reduction="none").view(3, 100)
    assert tokens.shape == (3, 100) and not tokens.requires_grad
    assert torch.allclose(tokens, want, rtol=1e-5, atol=1e-5)
    assert tokens[1, 7] == 0
    assert loss == pytest.approx(float(linear_cross_entropy(hidden, weight, labels)), rel=1e-6)
    assert float(tokens.sum()) / 299 == pytest.approx(float(loss), rel=1e-5)


def test_each_dataset_is_evaluated_on_its_own_valid_split(blend_corpus, tmp_path):
    """Bug: a dataset's loss taken over the wrong samples (another dataset's, the blend's
    share of it instead of its own first eval_samples, or the component order mixed up with
    the names), or the blend's loss changed by the per-dataset bookkeeping."""
    trainer, splits = _trainer(blend_corpus, tmp_path)
    valid = splits["valid"]
    got = trainer.evaluate(valid, 5)
    blend = blend_of(valid)
    assert blend.names == list(NAMES)
    for k, name in enumerate(NAMES):
        own = TokenSamples(blend.datasets[k], valid.seq_length)
        want = trainer.evaluate([own[j] for j in range(5)], 5)["valid_loss"]
        assert got[f"valid_loss/{name}"] == pytest.approx(want, rel=1e-6), name
        assert got[f"valid_ppl/{name}"] == pytest.approx(math.exp(want), rel=1e-6)
    want = trainer.evaluate([valid[i] for i in range(5)], 5)["valid_loss"]
    assert got["valid_loss"] == pytest.approx(want, rel=1e-6)
    # random tokens are harder than ramps even untrained: a swap would show
    assert got["valid_loss/code"] != pytest.approx(got["valid_loss/en"], rel=1e-3)


def test_per_source_train_loss_is_the_steps_samples_grouped_by_dataset(blend_corpus,
                                                                       tmp_path):
    """Bug: per-source sums grouped by the wrong sample ids or sources (the blend's
    ``dataset_index`` misread), counts off, or per-sample losses taken from another forward
    than the step's (the step's loss must come from the same numbers)."""
    trainer, splits = _trainer(blend_corpus, tmp_path)
    train = splits["train"]
    ids = [[0, 1], [2, 3]]
    micro = [torch.stack([train[i] for i in batch]) for batch in ids]
    before = trainer.sample_losses([train[i] for batch in ids for i in batch])  # eval, no step
    sources = sample_sources(train, ids)
    assert sources.tolist() == [int(blend_of(train).dataset_index[i]) for i in range(4)]
    result = trainer.train_step(micro, 1e-3, sources=sources, num_sources=2)
    sums, counts = result["source_totals"]
    for k in range(2):
        mine = sources == k
        assert counts[k] == int(mine.sum())
        assert sums[k] == pytest.approx(float(before[mine].sum()), rel=1e-6, abs=1e-9)
    assert sum(sums) / sum(counts) == pytest.approx(result["loss"], rel=1e-6)


def _assert_weighted_mean_is_the_loss(records: list[dict], corpus: str) -> None:
    """Each train record's per-source losses, weighted by the step's per-source sample counts
    (from the blend's dataset_index), average to the step's own loss (``loss_last``: ``loss``
    is the mean over the log interval)."""
    cfg = tiny_config(corpus, "/nonexistent", **SECTIONS)
    train = open_splits(corpus, cfg.data.seq_length, cfg.train.train_samples, None,
                        cfg.data.split, cfg.data.seed, None)["train"]
    index = blend_of(train).dataset_index
    assert [r["step"] for r in records] == [1, 2, 4]  # the first step, then every 2
    for record in records:
        last = record["consumed_samples"]
        counts = np.bincount(index[last - record["global_batch_size"]:last], minlength=2)
        weighted = sum(c * record.get(f"train_loss/{name}", 0.0)
                       for name, c in zip(NAMES, counts, strict=True)) / counts.sum()
        assert weighted == pytest.approx(record["loss_last"], rel=1e-6), record["step"]
        assert {f"train_loss/{n}" for n, c in zip(NAMES, counts, strict=True) if c} == {
            key for key in record if key.startswith("train_loss/")}


def test_reference_run_logs_per_dataset_losses(reference, blend_corpus):
    """Bug: the valid record or the train record at log steps lacks a dataset's key, or the
    per-source losses do not average (count-weighted) to the logged train loss."""
    for record in reference["valid"]:
        assert {f"valid_loss/{n}" for n in NAMES} | {f"valid_ppl/{n}" for n in NAMES} <= set(
            record)
    assert [r["step"] for r in reference["valid"]] == [2, 4]
    _assert_weighted_mean_is_the_loss(reference["train"], blend_corpus)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [{"data_parallel": 2}, {"tensor_parallel": 2},
                                      {"pipeline_parallel": 2}], ids=["dp2", "tp2", "pp2"])
def test_layouts_log_the_single_process_per_dataset_losses(reference, blend_corpus, tmp_path,
                                                           parallel):
    """Bug: per-source sums not reduced over dp (rank 0 logs its half of the batch), taken on
    a pp stage that has no loss (the first stage logs) or not broadcast to it, tp's
    vocabulary-sharded per-token losses summed per rank; or per-dataset valid losses that
    differ from one process's (a pp evaluation remainder, a dp rank evaluating other samples)."""
    got = run_distributed(2, _train_run, blend_corpus, str(tmp_path / "run"), parallel)[0]
    for want, have in zip(reference["valid"], got["valid"], strict=True):
        for key in ("valid_loss", *(f"valid_loss/{n}" for n in NAMES)):
            assert have[key] == pytest.approx(want[key], rel=RTOL), (have["step"], key)
    for want, have in zip(reference["train"], got["train"], strict=True):
        keys = [k for k in want if k.startswith("train_loss/")]
        assert keys and keys == [k for k in have if k.startswith("train_loss/")]
        for key in ["loss", "loss_last", *keys]:
            assert have[key] == pytest.approx(want[key], rel=RTOL), (have["step"], key)
    _assert_weighted_mean_is_the_loss(got["train"], blend_corpus)


def test_single_dataset_records_keep_their_keys(corpus, tmp_path, make_config):
    """Bug: a one-dataset run writes per-dataset keys that repeat the split's loss
    (``valid_loss/toy`` = ``valid_loss``) or per-source train keys."""
    cfg = make_config(corpus, tmp_path / "run",
                      train={"train_samples": 8, "log_interval": 1, "eval_interval": 2,
                             "eval_samples": 3})
    Trainer(cfg, log=lambda *_: None).run()
    (valid,) = _records(tmp_path / "run", "valid")
    assert set(valid) == {"kind", "step", "valid_loss", "valid_ppl"}
    assert not [k for r in _records(tmp_path / "run", "train") for k in r if "/" in k]


# -- trainer evaluate ------------------------------------------------------------------------
def _cli(*args, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "bloomline.trainer", "evaluate",
                           *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_cli_evaluate_json_matches_the_runs_last_evaluation(reference):
    """Bug: ``trainer evaluate`` evaluates other samples, another precision or other weights
    than the run's own evaluation of the same checkpoint, or its JSON misses a dataset."""
    out = json.loads(_cli(reference["checkpoint"], "--json").stdout)
    want = reference["valid"][-1]
    assert out["step"] == 4 and out["split"] == "valid"
    assert out["blend"]["samples"] == 5
    assert out["blend"]["loss"] == pytest.approx(want["valid_loss"], rel=1e-5)
    assert list(out["datasets"]) == list(NAMES)
    for name in NAMES:
        assert out["datasets"][name]["loss"] == pytest.approx(want[f"valid_loss/{name}"],
                                                               rel=1e-5)


@pytest.mark.slow
def test_cli_evaluate_table_on_the_test_split(reference):
    """Bug: ``--split test`` still reads the valid split, ``--samples`` is ignored, or the
    table lacks a dataset or the blend row."""
    text = _cli(reference["checkpoint"], "--split", "test", "--samples", "3").stdout
    lines = text.splitlines()
    assert "test split" in lines[0]
    assert lines[1].split() == ["dataset", "samples", "loss", "ppl"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert list(rows) == [*NAMES, "blend"]
    assert all(row[0] == "3" for row in rows.values())
    valid = reference["valid"][-1]
    assert float(rows["blend"][1]) != pytest.approx(valid["valid_loss"], abs=1e-4)


@pytest.mark.slow
def test_cli_evaluate_refuses_a_split_the_index_lacks(reference, tmp_path):
    """Bug: ``--split test`` on a run whose data.split gives test no share ends in a
    traceback (KeyError) instead of one line naming the split and data.split."""
    checkpoint = tmp_path / "step_00000004"
    shutil.copytree(reference["checkpoint"], checkpoint)
    config = checkpoint / "config.toml"
    config.write_text(config.read_text().replace('"80,10,10"', '"90,10,0"'))
    (checkpoint / MANIFEST).unlink()  # rehashed: a checkpoint saved with that split
    write_manifest(checkpoint, 4, is_writer=True)
    done = _cli(checkpoint, "--split", "test", ok=False)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and "test split" in message[0] and "data.split" in message[0]
