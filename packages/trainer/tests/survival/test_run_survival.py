"""A run survives its process: SIGTERM and SIGUSR1 mid-step save and exit 75, the wall-clock
budget does the same, SIGKILL at random points (in a step, in a checkpoint's write, sync or
async) loses nothing a resume does not redo exactly, and a hanging rank is caught by the
watchdog with its stack written. Real processes through the ``trainer`` command line, faults
injected with ``BLOOMLINE_FAULTS`` (``bloomline.trainer.survival.faults``); fp32 on CPU, so "equal"
means bitwise.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.config_loader import to_toml
from bloomline.trainer.loop import Trainer
from bloomline.trainer.survival.preemption import PREEMPTED_EXIT_CODE

TESTS = Path(__file__).parents[1]  # the tests root: the helper modules
STEPS = 24


def _recipe(corpus: str, run_dir: Path, path: Path, **sections) -> Path:
    settings = {"train": {"train_samples": 4 * STEPS, "log_interval": 1},
                "checkpoint": {"interval": 3, "keep_last": 2}}
    for section, values in sections.items():
        settings.setdefault(section, {}).update(values)
    path.write_text(to_toml(tiny_config(corpus, run_dir, **settings)))
    return path


def _trainer(*args: str, faults: str = "", timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("BLOOMLINE_FAULTS", None)
    if faults:
        env["BLOOMLINE_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _losses(run_dir: Path) -> dict[int, float]:
    """Loss by step; steps run again after a resume keep their last record."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The corpus, and the losses of the run none of the tests interrupts (in a process of its
    own, like the interrupted ones: the same thread count and kernels)."""
    root = tmp_path_factory.mktemp("survival")
    corpus = write_corpus(root / "corpus")
    recipe = _recipe(corpus, root / "straight", root / "straight.toml")
    done = _trainer("pretrain", "--config", str(recipe))
    assert done.returncode == 0, done.stderr
    losses = _losses(root / "straight")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return corpus, losses


@pytest.mark.slow
def test_sigusr1_and_sigterm_mid_step_save_exit_75_and_resume_exactly(uninterrupted, tmp_path):
    """Bug: a signal that kills the run without a checkpoint (the default action), one that
    stops before finishing the step or saves a half-updated state, an exit code the SLURM
    script cannot tell from a crash, or a resume that differs from the uninterrupted run."""
    corpus, straight = uninterrupted
    run = tmp_path / "run"
    recipe = _recipe(corpus, run, tmp_path / "recipe.toml")
    for fault, step in (("usr1", 4), ("term", 10)):
        done = _trainer("pretrain", "--config", str(recipe), faults=f"{fault}@step:step={step}")
        assert done.returncode == PREEMPTED_EXIT_CODE, done.stderr
        name = "SIGUSR1" if fault == "usr1" else "SIGTERM"
        assert (f"stopping after step {step}: received {name}; checkpoint saved, exit code "
                f"{PREEMPTED_EXIT_CODE}") in done.stdout, done.stdout
        assert (run / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
        assert max(_losses(run)) == step  # the step in progress was finished, no more
    done = _trainer("pretrain", "--config", str(recipe))
    assert done.returncode == 0, done.stderr
    assert _losses(run) == straight


def test_max_wallclock_saves_before_the_budget_and_exits_75(corpus, tmp_path, make_config):
    """Bug: train.max_wallclock ignored (the scheduler kills the job without a checkpoint)
    or the stop not recorded: a budget already used up stops after the first step with a
    checkpoint and the reason."""
    cfg = make_config(corpus, tmp_path / "run", train={"max_wallclock": 1e-6})
    state = Trainer(cfg, log=lambda *_: None).run()
    assert state.step == 1 and "train.max_wallclock" in state.stopped
    assert (tmp_path / "run" / "checkpoints" / "step_00000001" / "manifest.json").is_file()


@pytest.mark.slow
def test_kill_9_soak_ends_bitwise_equal(uninterrupted, tmp_path):
    """Bug: any state a SIGKILL can catch half-written (a checkpoint folder without its
    manifest, an async save in flight, metrics, the index cache) that a resume then trusts:
    killed at random steps and inside checkpoint writes (sync and async), each time resumed
    with --resume auto, the run must end with the uninterrupted run's losses, bitwise, and
    leave no hang report (nothing hung: the killed starts' watchdog headers are removed)."""
    corpus, straight = uninterrupted
    run = tmp_path / "run"
    recipe = _recipe(corpus, run, tmp_path / "recipe.toml")
    chooser = random.Random(17)
    step_kills = sorted(chooser.sample(range(2, STEPS), 3))
    save_kills = chooser.sample(range(3, STEPS, 3), 2)  # checkpoint steps (interval 3)
    kills = [(f"kill@step:step={s}", "false") for s in step_kills]
    kills += [(f"kill@save:step={save_kills[0]}", "false"),
              (f"kill@save:step={save_kills[1]}", "true")]
    kills.sort(key=lambda kill: int(kill[0].rsplit("=", 1)[1]))  # each run gets further
    for fault, async_save in kills:
        done = _trainer("pretrain", "--config", str(recipe), f"checkpoint.async={async_save}",
                        faults=fault)
        assert done.returncode == -9, (fault, done.stderr)
        assert f"fault: kill@{fault[5:].split(':')[0]}" in done.stderr
    done = _trainer("pretrain", "--config", str(recipe), "checkpoint.async=true")
    assert done.returncode == 0, done.stderr
    assert _losses(run) == straight, kills
    assert not (run / "watchdog").exists(), list((run / "watchdog").iterdir())


@pytest.mark.slow
def test_watchdog_dumps_the_hanging_rank_and_ends_the_run(uninterrupted, tmp_path):
    """Bug: a rank stuck forever (a collective whose peer hangs, a dead file system) that
    keeps the job idling until its time limit, or that dies without saying where: with rank 1
    asleep in step 7, the run must end non-zero within seconds and rank 1's report name the
    step and show its stack (the sleeping fault point)."""
    corpus, _ = uninterrupted
    run = tmp_path / "run"
    recipe = _recipe(corpus, run, tmp_path / "recipe.toml",
                     watchdog={"factor": 1.0, "floor_seconds": 2.0, "startup_seconds": 60.0})
    done = _trainer("pretrain", "--nproc", "2", "--config", str(recipe),
                    "parallel.data_parallel=2", faults="hang@step:step=7:rank=1", timeout=120)
    assert done.returncode != 0, done.stdout
    report = (run / "watchdog" / "rank_1.txt").read_text()
    assert report.startswith("watchdog: timing step 7 with a limit of 2 s"), report
    assert "\nTimeout (0:00:02)!" in report, report
    assert 'faults.py", line' in report and "in fire" in report, report
