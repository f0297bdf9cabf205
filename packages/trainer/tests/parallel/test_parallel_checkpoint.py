"""Resharding checkpoints: a checkpoint written by one layout (sharded over its ranks by DCP)
loads into another with the same model and optimizer state and goes on with the same samples
(``consumed_samples`` carries over when dp changes; the global batch is fixed), so the
continued run's losses equal an uninterrupted one-process run's. ``trainer export-hf`` reads
such a checkpoint in one process.

"The same state" is checked on full tensors: every parameter and every AdamW moment
(``exp_avg``, ``exp_avg_sq``, ``step``) by parameter name, gathered from the loading layout,
equals what the saving layout gathered when it saved (exactly: loading copies bytes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_fixtures import write_corpus

from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.local_processes import run_distributed

pytestmark = pytest.mark.slow

STEPS, SAVED_AT = 6, 3


def _config(corpus: str, run_dir, parallel: dict, resume: str = "none",
            exit_interval: int = 0) -> Config:
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = 128, 32, 4, 4
    cfg.data.corpus, cfg.data.seq_length, cfg.data.split = corpus, 16, "100,0,0"
    cfg.data.num_workers = 0
    t = cfg.train
    t.micro_batch_size, t.global_batch_size, t.train_samples = 2, 8, 8 * STEPS
    t.log_interval, t.eval_interval, t.exit_interval = 1, 0, exit_interval
    t.run_dir, t.device = str(run_dir), "cpu"
    cfg.precision.dtype = "fp32"
    cfg.optimizer.lr, cfg.optimizer.clip_grad = 3e-3, 1.0
    cfg.schedule.warmup = 2
    cfg.checkpoint.interval, cfg.checkpoint.resume = 0, resume
    cfg.monitor.tensorboard, cfg.monitor.activation_stats_interval = False, 0
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    return cfg


def _no_peak_measurement() -> None:
    """Each run times a matmul for 0.5 s to report MFU; these tests do not read it."""
    import bloomline.trainer.reporting.monitor as monitor

    monitor.measure_peak_flops = lambda device, dtype: 1e12


def _full_state(trainer: Trainer) -> dict:
    """{"model": {name: tensor}, "optim": {name: {exp_avg, exp_avg_sq, step}}} as full CPU
    tensors (on every rank; a pipeline stage holds its own parameters only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(trainer.model, trainer.optimizer,
                                  options=StateDictOptions(full_state_dict=True))
    return {"model": {k: v.detach().cpu().clone() for k, v in model.items()},
            "optim": {name: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v
                             for k, v in state.items()}
                      for name, state in optim["state"].items()}}


def _checkpoint(run_dir) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{SAVED_AT:08d}"


def _save_then_load(corpus: str, jobs: list[tuple[str, dict, list[dict]]]) -> list[dict]:
    """In this process (one rank of a run), for each job (root folder, saving layout, loading
    layouts): train the saving layout to step SAVED_AT, then for each loading layout resume
    from that checkpoint and train to the end. Returns per job the full states: saved, and
    each load's right after loading. (Several jobs in one run: starting processes is what
    costs here.)"""
    _no_peak_measurement()
    return [_one_job(corpus, Path(root), saves, loads) for root, saves, loads in jobs]


def _one_job(corpus: str, root: Path, saves: dict | None, loads: list[dict]) -> dict:
    """``saves`` None: the checkpoint is there already."""
    import torch.distributed as dist

    result = {}
    if saves is not None:
        saver = Trainer(_config(corpus, root / "saved", saves, exit_interval=SAVED_AT),
                        log=lambda *_: None)
        saver.run()
        result["saved"] = _full_state(saver)
        del saver
        if dist.is_initialized():
            dist.barrier()  # rank 0 renames the checkpoint folder into place after the others
    for index, layout in enumerate(loads):
        trainer = Trainer(_config(corpus, root / f"loaded_{index}", layout,
                                  resume=str(_checkpoint(root / "saved"))), log=lambda *_: None)
        trainer.resume()
        result[f"loaded_{index}"] = _full_state(trainer)
        trainer.run()  # resumes again (the same state) and trains to the end
    return result


def _losses(run_dir) -> list[float]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]


def _assert_same_state(saved: dict, loaded: dict, what: str) -> None:
    assert loaded["model"].keys() == saved["model"].keys(), what
    for name, value in saved["model"].items():
        assert torch.equal(loaded["model"][name], value), f"{what}: parameter {name}"
    assert loaded["optim"].keys() == saved["optim"].keys(), what
    for name, state in saved["optim"].items():
        assert state.keys() == loaded["optim"][name].keys() >= {"exp_avg", "exp_avg_sq", "step"}
        for key, value in state.items():
            got = loaded["optim"][name][key]
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(value)), \
                f"{what}: optimizer {key} of {name}"


def _assert_close(losses: list[float], reference: list[float], what: str) -> None:
    assert len(losses) == len(reference), f"{what}: {len(losses)} steps"
    for step, (got, want) in enumerate(zip(losses, reference, strict=True)):
        assert abs(got - want) <= 1e-5 * abs(want), f"{what}, step {step + 1}: {got} vs {want}"


@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory):
    """One 2-process job: dp2 ZeRO-3 saves, tp2 loads; tp2 saves, dp2 ZeRO-1 loads. And the
    one-process run they must all reproduce."""
    root = tmp_path_factory.mktemp("reshard")
    corpus = write_corpus(root / "corpus")
    _no_peak_measurement()
    Trainer(_config(corpus, root / "reference", {}), log=lambda *_: None).run()
    jobs = [(str(root / "dp2z3"), {"data_parallel": 2, "zero_stage": 3}, [{"tensor_parallel": 2}]),
            (str(root / "tp2"), {"tensor_parallel": 2}, [{"data_parallel": 2, "zero_stage": 1}])]
    dp_to_tp, tp_to_dp = run_distributed(2, _save_then_load, corpus, jobs)[0]
    return {"root": root, "corpus": corpus, "reference": _losses(root / "reference"),
            "dp_to_tp": dp_to_tp, "tp_to_dp": tp_to_dp}


def test_dp_zero3_checkpoint_continues_at_tp2_and_in_one_process(two_layouts):
    """Bug: a checkpoint saved with FSDP2-sharded parameters and moments (dp2, ZeRO-3) loads
    only into the layout that wrote it, loses optimizer moments or their step on the way, or
    resumes at another sample (consumed samples counted per rank): loaded at tp2 and in one
    process, the state must equal what was saved and steps 4-6 the uninterrupted run's."""
    root, corpus, reference = two_layouts["root"], two_layouts["corpus"], two_layouts["reference"]
    saved = two_layouts["dp_to_tp"]["saved"]
    _assert_close(_losses(root / "dp2z3" / "saved"), reference[:SAVED_AT], "dp2 zero3")
    _assert_same_state(saved, two_layouts["dp_to_tp"]["loaded_0"], "dp2 zero3 -> tp2")
    _assert_close(_losses(root / "dp2z3" / "loaded_0"), reference[SAVED_AT:], "-> tp2")
    assert sorted(p.name for p in _checkpoint(root / "dp2z3" / "saved").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its shard
    trainer = Trainer(_config(corpus, root / "dp2z3" / "one", {},
                              resume=str(_checkpoint(root / "dp2z3" / "saved"))),
                      log=lambda *_: None)
    trainer.resume()
    _assert_same_state(saved, _full_state(trainer), "dp2 zero3 -> one process")
    trainer.run()
    _assert_close(_losses(root / "dp2z3" / "one"), reference[SAVED_AT:], "-> one process")


def test_tp2_checkpoint_continues_at_dp2_zero1(two_layouts):
    """Bug: tensor-parallel shards (heads, MLP columns, vocabulary rows) saved as local
    tensors, or ZeRO-1's partitioned optimizer state keyed by position instead of parameter
    name: loading tp2 into dp2 ZeRO-1 must give the saved state and the uninterrupted run's
    losses."""
    root, reference = two_layouts["root"], two_layouts["reference"]
    _assert_close(_losses(root / "tp2" / "saved"), reference[:SAVED_AT], "tp2")
    _assert_same_state(two_layouts["tp_to_dp"]["saved"], two_layouts["tp_to_dp"]["loaded_0"],
                       "tp2 -> dp2 zero1")
    _assert_close(_losses(root / "tp2" / "loaded_0"), reference[SAVED_AT:], "-> dp2 zero1")


def test_export_hf_from_a_sharded_checkpoint(two_layouts, tmp_path):
    """Bug: export-hf reads only rank 0's shard (half of every FSDP-sharded tensor) or needs
    the saving layout's processes: run in one process on the dp2 ZeRO-3 checkpoint, it must
    write exactly the weights the saving run gathered."""
    from safetensors.torch import load_file

    from bloomline.trainer.hf import export_hf

    root = two_layouts["root"]
    checkpoint = _checkpoint(root / "dp2z3" / "saved")
    done = subprocess.run([sys.executable, "-m", "bloomline.trainer", "export-hf",
                           str(checkpoint), str(tmp_path / "from_shards")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cfg = _config(two_layouts["corpus"], tmp_path, {})
    export_hf(two_layouts["dp_to_tp"]["saved"]["model"], cfg.model, tmp_path / "from_full")
    got = load_file(tmp_path / "from_shards" / "model.safetensors")
    want = load_file(tmp_path / "from_full" / "model.safetensors")
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert (json.loads((tmp_path / "from_shards" / "config.json").read_text())
            == json.loads((tmp_path / "from_full" / "config.json").read_text()))


def _merge_stages(states: list[dict]) -> dict:
    """The whole model's state from the ranks' (each pipeline stage holds its own part)."""
    merged: dict = {"model": {}, "optim": {}}
    for state in states:
        for part in merged:
            for name, value in state[part].items():
                merged[part].setdefault(name, value)
    return merged


@pytest.mark.slow
def test_3d_checkpoint_continues_at_dp4_at_tp2_and_in_one_process(tmp_path):
    """Bug: a checkpoint of pipeline stages (each rank holding some blocks, the last stage a
    copy of the tied embedding) x ZeRO-1 shards x tp shards saves a stage's parameters under
    stage-local names, drops the tied copy's twin or writes it twice with different moments,
    or loads only into 8 processes: saved at pp2 x dp2 x tp2, it must load at dp4 (ZeRO-2),
    at dp2 x tp2 and in one process with the saved state and continue as one process runs."""
    corpus = write_corpus(tmp_path / "corpus")
    _no_peak_measurement()
    Trainer(_config(corpus, tmp_path / "reference", {}), log=lambda *_: None).run()
    reference = _losses(tmp_path / "reference")
    root = tmp_path / "3d"
    three_d = {"pipeline_parallel": 2, "data_parallel": 2, "tensor_parallel": 2,
               "zero_stage": 1}
    saved = _merge_stages([rank[0]["saved"] for rank in run_distributed(
        8, _save_then_load, corpus, [(str(root), three_d, [])])])
    _assert_close(_losses(root / "saved"), reference[:SAVED_AT], "pp2 x dp2 x tp2")
    assert len(list(_checkpoint(root / "saved").glob("*.distcp"))) == 8
    loads = [{"data_parallel": 4, "zero_stage": 2}, {"tensor_parallel": 2}]
    loaded = run_distributed(4, _save_then_load, corpus, [(str(root), None, loads)])[0][0]
    for index, what in enumerate(("dp4 zero2", "dp2 x tp2")):
        _assert_same_state(saved, loaded[f"loaded_{index}"], f"3d -> {what}")
        _assert_close(_losses(root / f"loaded_{index}"), reference[SAVED_AT:], f"-> {what}")
    trainer = Trainer(_config(corpus, root / "one", {}, resume=str(_checkpoint(root / "saved"))),
                      log=lambda *_: None)
    trainer.resume()
    _assert_same_state(saved, _full_state(trainer), "3d -> one process")
    trainer.run()
    _assert_close(_losses(root / "one"), reference[SAVED_AT:], "-> one process")
