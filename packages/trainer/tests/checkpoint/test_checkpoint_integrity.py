"""Verified and asynchronous checkpoints: a checkpoint damaged after saving (a flipped byte,
a truncated or lost shard, a lost or garbled manifest, a state file that does not parse) is
refused before anything is unpickled, and the run falls back to the previous one; RNG states
are saved without pickle; async saves snapshot the state when called, resume bitwise like
sync ones, and a process killed during one leaves nothing that looks complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.config_loader import to_toml
from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.checkpoint.async_save import AsyncCheckpointer
from bloomline.trainer.checkpoint.manifest import MANIFEST, verify_checkpoint, write_manifest
from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.local_processes import run_distributed

# DCP warns that it saves in one process; the async save does it from a background thread
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

TESTS = Path(__file__).parents[1]  # the tests root: the helper modules
# 20 steps of 4 samples, a checkpoint every 5, the last 3 kept: steps 10, 15, 20
SETTINGS = {"train": {"train_samples": 80, "log_interval": 1},
            "checkpoint": {"interval": 5, "keep_last": 3}}


def _fast_trainers() -> None:
    """Each run times a matmul for 0.5 s to report MFU; these tests do not read it."""
    import bloomline.trainer.reporting.monitor as monitor

    monitor.measure_peak_flops = lambda device, dtype: 1e12


def _losses(run_dir) -> dict[int, float]:
    """Loss by step (a step trained again after a resume keeps its last record)."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"}


def _step(run_dir, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}"


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A finished 20-step run (checkpoints 10, 15, 20) and its losses by step."""
    _fast_trainers()
    root = tmp_path_factory.mktemp("integrity")
    corpus = write_corpus(root / "corpus")
    Trainer(tiny_config(corpus, root / "run", **SETTINGS), log=lambda *_: None).run()
    return {"root": root, "corpus": corpus, "run": root / "run", "losses": _losses(root / "run")}


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def _bad_state_json(path: Path) -> None:
    """trainer_state.json that does not parse, in a manifest that agrees with it (a save that
    wrote garbage: only the parse check can catch it)."""
    (path / "trainer_state.json").write_text('{"step": 20,')
    (path / MANIFEST).unlink()
    write_manifest(path, 20, is_writer=True)


DAMAGES = {
    "flipped byte in a shard": (lambda p: _flip_byte(p / "__0_0.distcp"),
                                "__0_0.distcp: sha256 differs"),
    "truncated shard": (lambda p: _truncate(p / "__0_0.distcp"), "__0_0.distcp: "),
    "missing shard": (lambda p: (p / "__0_0.distcp").unlink(),
                      "__0_0.distcp: listed in the manifest but missing"),
    "missing manifest": (lambda p: (p / MANIFEST).unlink(), None),  # not even a candidate
    "bad JSON in the manifest": (lambda p: (p / MANIFEST).write_text('{"files": '),
                                 "manifest.json: bad JSON"),
    "bad JSON in trainer_state": (_bad_state_json, "trainer_state.json: does not parse"),
    "unlisted file": (lambda p: (p / "extra.bin").write_bytes(b"x"),
                      "extra.bin: present but not listed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_checkpoint_is_refused_and_the_previous_one_is_used(reference, tmp_path,
                                                                    damage):
    """Bug: a checkpoint damaged after saving (bit rot, a copy cut short, a lost shard, a
    garbled manifest or state file) is returned by latest_checkpoint and loaded (garbage
    weights, or a crash deep in DCP), or refused with no word of why: verify_checkpoint must
    name the file, latest_checkpoint fall back to step 15 and log that one line once."""
    run = tmp_path / "run"
    shutil.copytree(reference["run"], run)
    newest = _step(run, 20)
    assert verify_checkpoint(newest) == []
    damage_fn, expected = DAMAGES[damage]
    damage_fn(newest)
    problems = verify_checkpoint(newest)
    assert problems and all(isinstance(p, str) and "\n" not in p for p in problems)
    lines: list[str] = []
    assert ckpt.latest_checkpoint(run, log=lines.append) == _step(run, 15)
    if expected is None:  # no manifest: an unfinished save, never a candidate
        assert problems[0].startswith("manifest.json: missing")
        assert lines == [] and newest not in ckpt.list_checkpoints(run)
    else:
        assert problems[0].startswith(expected), problems
        assert lines == [f"checkpoint {newest}: damaged ({problems[0]}); falling back to the "
                         "previous one"]
    with pytest.raises(UserError, match="damaged or incomplete checkpoint"):
        ckpt.load_checkpoint(newest, torch.nn.Linear(2, 2))  # refused before DCP reads it


@pytest.mark.slow
def test_resume_falls_back_past_a_damaged_checkpoint_and_continues_exactly(reference,
                                                                           tmp_path):
    """Bug: resume=auto loads the newest checkpoint although a shard of it is damaged, falls
    back silently, or falls back to a state that does not continue the run exactly: with
    step 20's shard flipped, the run must log the fallback once, resume at step 15 and train
    steps 16-20 with the uninterrupted run's losses (bitwise, fp32)."""
    _fast_trainers()
    run = tmp_path / "run"
    shutil.copytree(reference["run"], run)
    _flip_byte(_step(run, 20) / "__0_0.distcp")
    lines: list[str] = []
    Trainer(tiny_config(reference["corpus"], run, **SETTINGS), log=lines.append).run()
    fallback = [line for line in lines if "falling back" in line]
    assert fallback == [f"checkpoint {_step(run, 20)}: damaged (__0_0.distcp: sha256 differs "
                        "from the manifest's (content changed after saving)); falling back "
                        "to the previous one"], lines
    assert any(line.endswith("resumed from " + str(_step(run, 15))) for line in lines), lines
    assert _losses(run) == reference["losses"]  # steps 16-20 trained again, the same
    assert verify_checkpoint(_step(run, 20)) == []  # saved again, intact


def _trainer_cli(*args: str, env: dict | None = None, timeout: float = 300):
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_verify_checkpoint_command(reference, tmp_path):
    """Bug: `trainer verify-checkpoint` reports a damaged checkpoint as good, exits 0 on it,
    or dies with a traceback: on a good one it must exit 0 with "ok" and the counts, on one
    with a flipped byte exit 1 with one line naming the file."""
    good = _step(reference["run"], 15)
    done = _trainer_cli("verify-checkpoint", str(good))
    manifest = json.loads((good / MANIFEST).read_text())
    size = sum(f["size"] for f in manifest["files"].values())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"ok: {good}: {len(manifest['files'])} files, {size} bytes, "
                                   "step 15")
    bad = tmp_path / "step_00000015"
    shutil.copytree(good, bad)
    _flip_byte(bad / "__0_0.distcp")
    done = _trainer_cli("verify-checkpoint", str(bad))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: {bad}: __0_0.distcp: sha256 differs from the "
                                        "manifest's (content changed after saving)"]


def _draws() -> list:
    """A draw from every generator a checkpoint restores (Gaussians first: they use the
    cached second value of the pair, when there is one)."""
    return [random.gauss(0, 1), random.random(), float(np.random.normal()),
            float(np.random.rand()), torch.randn(2).tolist(), torch.rand(3).tolist()]


def test_rng_states_round_trip_bit_exactly_without_pickle(tmp_path):
    """Bug: RNG states saved with pickle (loading a checkpoint runs code from it) or restored
    approximately (a float through JSON, numpy's cached Gaussian or Python's gauss_next lost):
    a checkpoint's rng.json must be plain JSON, and loading it must make every generator draw
    exactly what it drew after the save."""
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached second Gaussian (gauss_next)
    np.random.normal()  # and numpy's has_gauss / cached_gaussian
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    path = ckpt.save_checkpoint(tmp_path, 1, model, optimizer, {"step": 1}, tiny_config("", ""),
                                keep_last=1)
    after_save = _draws()
    _draws()  # move every generator on
    assert ckpt.load_checkpoint(path, model, optimizer) == {"step": 1}
    assert _draws() == after_save
    state = json.loads((path / "rng.json").read_text())  # JSON, not a pickle
    assert set(state) >= {"python", "numpy", "torch"}
    assert not list(path.glob("*.pt"))


def test_async_save_snapshots_the_state_when_called(tmp_path):
    """Bug: the async save writes the model, optimizer, trainer state or RNG as they are when
    the background write gets to them (training has moved on: a checkpoint mixing two steps),
    or its save() returns before the copy is made: parameters, moments and counters changed
    right after save() returns must not reach the checkpoint."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    saved_weight = model.weight.detach().clone()
    saved_moment = optimizer.state[model.weight]["exp_avg"].clone()
    state = {"step": 7, "consumed_samples": 28}
    rng_at_save = torch.get_rng_state()
    with AsyncCheckpointer(tmp_path, keep_last=2) as saver:
        final = saver.save(7, model, optimizer, state, tiny_config("", ""))
        with torch.no_grad():
            model.weight.add_(1.0)
        optimizer.state[model.weight]["exp_avg"].add_(1.0)
        state["step"] = 8
        torch.rand(10)
        assert saver.wait() == final and not saver.in_flight
    assert verify_checkpoint(final) == [] and ckpt.latest_checkpoint(tmp_path) == final
    assert not list((tmp_path / "checkpoints").glob(".*.partial"))
    loaded = torch.nn.Linear(64, 64)
    loaded_optimizer = torch.optim.AdamW(loaded.parameters())
    assert ckpt.load_checkpoint(final, loaded, loaded_optimizer)["step"] == 7
    assert torch.equal(loaded.weight, saved_weight)
    assert torch.equal(loaded_optimizer.state[loaded.weight]["exp_avg"], saved_moment)
    assert torch.equal(torch.get_rng_state(), rng_at_save)


@pytest.mark.slow
def test_async_checkpoints_resume_bitwise_like_an_uninterrupted_run(reference, tmp_path):
    """Bug: an async checkpoint that misses state the sync one has, is still being written
    when the run ends (no manifest: the resume starts over), or prunes the wrong folders:
    with checkpoint.async, 10 steps + resume + 10 must give the uninterrupted run's losses
    exactly, and leave the same checkpoints."""
    _fast_trainers()
    settings = {**SETTINGS, "checkpoint": {**SETTINGS["checkpoint"], "async_": True}}
    run = tmp_path / "async"
    first = tiny_config(reference["corpus"], run, **settings)
    first.train.exit_interval = 10
    Trainer(first, log=lambda *_: None).run()
    assert ckpt.latest_checkpoint(run) == _step(run, 10)
    lines: list[str] = []
    Trainer(tiny_config(reference["corpus"], run, **settings), log=lines.append).run()
    assert any(line.endswith("resumed from " + str(_step(run, 10))) for line in lines)
    assert _losses(run) == reference["losses"]
    assert [p.name for p in ckpt.list_checkpoints(run)] == [
        p.name for p in ckpt.list_checkpoints(reference["run"])]
    assert all(verify_checkpoint(p) == [] for p in ckpt.list_checkpoints(run))


@pytest.mark.slow
def test_kill_during_an_async_save_leaves_no_checkpoint_and_the_rerun_resumes(reference,
                                                                             tmp_path):
    """Bug: a process killed while an async checkpoint is written (after its tensors, before
    its manifest) leaves a folder that latest_checkpoint returns (a resume from half a
    checkpoint), or the partial folder is never cleaned up: killed at step 10's save, the run
    must have step 5 as its latest checkpoint; run again, it resumes from 5, removes the
    partial folder and ends with the uninterrupted run's losses."""
    settings = {"train": {"train_samples": 80, "log_interval": 1},
                "checkpoint": {"interval": 5, "keep_last": 3, "async_": True}}
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(tiny_config(reference["corpus"], run, **settings)))
    done = _trainer_cli("pretrain", "--config", str(recipe),
                        env={**os.environ, "BLOOMLINE_FAULTS": "kill@save:step=10"})
    assert done.returncode == -9, done.stderr
    assert "fault: kill@save {'step': 10}" in done.stderr
    partial = run / "checkpoints" / ".step_00000010.partial"
    assert list(partial.glob("*.distcp")) and not (partial / MANIFEST).exists()
    assert ckpt.latest_checkpoint(run) == _step(run, 5)
    done = _trainer_cli("pretrain", "--config", str(recipe))
    assert done.returncode == 0, done.stderr
    assert "resumed from " + str(_step(run, 5)) in done.stdout
    assert not partial.exists()
    assert _losses(run) == reference["losses"]


def _save_at_dp2(corpus: str, root: str) -> list:
    """In each of 2 ranks: train 2 steps at dp2 ZeRO-3 (a sync checkpoint at the end), save
    the same state async into another run, verify both with the hashing shared; then rank 0
    flips a byte of the shard the other rank hashes, and both verify again."""
    import torch.distributed as dist

    _fast_trainers()
    root = Path(root)
    cfg = tiny_config(corpus, root / "sync", train={"train_samples": 8},
                      parallel={"data_parallel": 2, "zero_stage": 3})
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.run()
    with AsyncCheckpointer(root / "async", keep_last=1, is_writer=trainer.is_main) as saver:
        saver.save(2, trainer.model, trainer.optimizer, trainer.state.state_dict(), cfg)
    paths = [_step(root / "sync", 2), _step(root / "async", 2)]
    results = [verify_checkpoint(path) for path in paths]
    # sorted files: .metadata, __0_0.distcp, __1_0.distcp, ...: rank 1 hashes __0_0.distcp
    if dist.get_rank() == 0:
        _flip_byte(paths[1] / "__0_0.distcp")
    dist.barrier()
    results.append(verify_checkpoint(paths[1]))
    return results


@pytest.mark.slow
def test_two_ranks_save_sync_and_async_with_shared_hashing(tmp_path):
    """Bug: the manifest lists only the writer's shard (the other rank's file unchecked) or
    is written before the other rank's write ends, the async save runs its collectives on
    the training thread's group (a hang), or the ranks' shares of the hashing are lost or
    disagree: at dp2, both manifests must list both shards and verify on both ranks, and a
    byte flipped in the shard rank 1 hashes must be reported by both ranks."""
    corpus = write_corpus(tmp_path / "corpus")
    results = run_distributed(2, _save_at_dp2, corpus, str(tmp_path))
    assert results[0] == results[1]
    assert results[0][:2] == [[], []]
    assert results[0][2] == ["__0_0.distcp: sha256 differs from the manifest's (content "
                             "changed after saving)"]
    for kind in ("sync", "async"):
        files = json.loads((_step(tmp_path / kind, 2) / MANIFEST).read_text())["files"]
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "rng.json", "config.toml",
                "trainer_state.json"} == set(files)
    assert verify_checkpoint(_step(tmp_path / "sync", 2)) == []  # in one process too


def test_a_short_write_on_a_full_disk_is_one_line_and_elsewhere_a_bug(tmp_path, monkeypatch):
    """Bug: torch's zip writer reports a write that a full disk cut short as "unexpected pos"
    (a RuntimeError inside DCP's CheckpointException), not as an OSError: the save then died
    with a multi-rank traceback instead of the full-disk line, depending on which file the
    disk filled up in. On a disk with (next to) nothing left it must be the one line; the
    same error with space left stays a bug's traceback."""
    from torch.distributed.checkpoint.api import CheckpointException

    from bloomline.trainer.checkpoint import failure
    from bloomline.trainer.checkpoint.layout import PendingSave

    def failing_save():
        pending = PendingSave(tmp_path / "checkpoints", 10, 3, True, files={})
        pending.partial.mkdir(parents=True)
        with failure.failed_save(pending):
            short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                                 "704 vs 598")
            raise CheckpointException("save", {0: (short, None)})
        return pending

    monkeypatch.setattr(failure, "free_disk", lambda path: 4096)
    with pytest.raises(UserError, match=r"checkpoint of step 10: cannot write .*\.step_00000010"
                                        r"\.partial: No space left on device; the unfinished "
                                        r"checkpoint was removed"):
        failing_save()
    assert not (tmp_path / "checkpoints" / ".step_00000010.partial").exists()
    monkeypatch.setattr(failure, "free_disk", lambda path: 10 << 30)
    with pytest.raises(CheckpointException):
        failing_save()
