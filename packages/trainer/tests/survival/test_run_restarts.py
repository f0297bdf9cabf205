"""Run survival on the launcher's side: ``trainer pretrain --max-restarts`` restarts every rank
from the newest checkpoint after one dies, and a preempted run (SIGUSR1 / SIGTERM) ends the
launcher with exit code 75, on which the SLURM script requeues the job.

The probe tests (``python -m test_parallel_launch launch-...``) prove the launcher's half on
its own; the trainer and SLURM tests run the whole thing with faults injected through
``BLOOMLINE_FAULTS`` (``faults.py``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_parallel_launch import _env, _trainer, run_sbatch, slurm_env

pytestmark = pytest.mark.slow

PREEMPTED = 75


def _last_record_per_step(run_dir) -> dict[int, dict]:
    """A restart logs again the steps after its checkpoint: the last record of a step wins."""
    records = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            records[record["step"]] = record
    return records


def _start_probe(command: str) -> tuple[subprocess.Popen, list[int]]:
    """The launcher probe, once both of its ranks say they are waiting: (process, rank pids)."""
    launcher = subprocess.Popen([sys.executable, "-m", "test_parallel_launch", command],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    pids = []
    for _ in range(2):
        line = launcher.stdout.readline()
        if not line.startswith("rank "):
            launcher.kill()
            raise AssertionError(f"probe did not start: {line!r}\n{launcher.stderr.read()}")
        pids.append(int(line.split()[-1]))
    return launcher, pids


def _assert_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            Path(f"/proc/{pid}").stat()
        except FileNotFoundError:
            continue
        raise AssertionError(f"rank process {pid} is still running")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["usr1", "term"])
def test_a_preempted_run_ends_the_launcher_with_exit_code_75(sig):
    """Bug: SIGUSR1 to the launcher kills it (Python's default action) or never reaches the
    ranks (torchrun starts each in a session of its own and ignores SIGUSR1), or the ranks'
    preempted exit is taken for success (exit 0) or a failure (restarted: the probe allows one
    restart, whose ranks would wait for a signal that never comes), or after SIGTERM the
    launcher reports 143 although every rank saved: each rank waits for the signal, stops
    through ``exit_preempted``, and the launcher must exit 75 with one line."""
    launcher, pids = _start_probe("launch-preempt")
    try:
        launcher.send_signal(sig)
        _, stderr = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == PREEMPTED, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "error: preempted: the run saved a checkpoint and stopped; exit code 75"), stderr
    assert "no signal came" not in stderr
    if sig == signal.SIGUSR1:  # the launcher found both ranks (and no other process)
        assert "launcher: SIGUSR1 forwarded to 2 worker process(es)" in stderr, stderr
    _assert_gone(pids)


def test_a_rank_that_dies_on_every_restart_fails_the_run_with_one_line():
    """Bug: --max-restarts is not handed to torchrun (no restart: one start), restarts loop
    forever, or the run that spent its restarts ends with torchrun's failure table or exit 0:
    rank 1 is SIGKILLed on both starts, and the launcher must exit non-zero with one line
    saying which rank failed and that the restart was spent."""
    done = subprocess.run([sys.executable, "-m", "test_parallel_launch", "launch-die"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == ["rank 1 start 0", "rank 1 start 1"], done.stdout
    assert done.stderr.strip().splitlines() == [
        "error: rank 1 failed (signal SIGKILL) after 1 restart; its output above says why"], \
        done.stderr


def test_max_restarts_resumes_a_killed_rank_and_trains_as_if_uninterrupted(
        corpus, tmp_path, make_config):
    """Bug: a rank killed mid-run (SIGKILL at step 6, first start only) ends the run although
    --max-restarts 1 was given, the restart starts from scratch or from a stale checkpoint
    instead of step 4's, or the resumed steps differ from an uninterrupted run (data order,
    optimizer or RNG state not restored): the run must finish, log step 5 again after the
    restart, and every step's last loss must match one process's run within 1e-5."""
    from bloomline.common.config_loader import to_toml
    from bloomline.trainer.loop import Trainer

    settings = {"train": {"train_samples": 32, "log_interval": 1},
                "checkpoint": {"interval": 2}}
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(make_config(corpus, tmp_path / "two", **settings)))
    env = dict(_env(), BLOOMLINE_FAULTS="kill@step:step=6:rank=1:attempt=0")
    done = subprocess.run([sys.executable, "-m", "bloomline.trainer", "pretrain", "--nproc", "2",
                           "--max-restarts", "1", "--config", str(recipe),
                           "parallel.data_parallel=2"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("fault: kill@step") == 1, done.stderr
    lines = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    logged = [r["step"] for r in map(json.loads, lines) if r["kind"] == "train"]
    assert logged == [1, 2, 3, 4, 5, 5, 6, 7, 8], logged  # the restart went back to step 4
    info = json.loads((tmp_path / "two" / "run_info.json").read_text())
    assert info["resumed_from"].endswith("step_00000004"), info
    Trainer(make_config(corpus, tmp_path / "one", **settings), log=lambda *_: None).run()
    two, one = _last_record_per_step(tmp_path / "two"), _last_record_per_step(tmp_path / "one")
    assert sorted(two) == sorted(one) == list(range(1, 9))
    for step, want in one.items():
        got = two[step]["loss"]
        assert abs(got - want["loss"]) <= 1e-5 * abs(want["loss"]), (step, got, want["loss"])


def test_max_restarts_refuses_a_fixed_resume_checkpoint(tmp_path):
    """Bug: --max-restarts with --resume PATH (or none) starts every restart from PATH again
    (or from scratch), silently throwing away the steps trained since: refused with one line
    before any process starts."""
    done = _trainer("pretrain", "--max-restarts", "2", "--resume", str(tmp_path), timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: --max-restarts 2 with checkpoint.resume {tmp_path}: every restart would start "
        f"again from {tmp_path}; use --resume auto (run once without restarts to get a first "
        "checkpoint in train.run_dir)"], done.stderr


def test_slurm_script_requeues_a_preempted_run(corpus, tmp_path, make_config):
    """Bug: the SLURM script does not requeue a preempted run (it checks the wrong exit code,
    or `set -e` ends it at srun's non-zero exit), requeues another job, or the run it requeues
    did not save: rank 1 alone gets SIGUSR1 before step 2 (SLURM's --signal=USR1@120); both
    ranks must save step 2 and stop, the launcher exit 75 and the script call
    `scontrol requeue 4242`. Needs the worker side (loop + ``exit_preempted``)."""
    from bloomline.common.config_loader import to_toml

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(make_config(corpus, tmp_path / "run",
                                          train={"train_samples": 40, "log_interval": 1})))
    env = slurm_env(tmp_path, recipe, BLOOMLINE_FAULTS="usr1@step:step=2:rank=1")
    done = run_sbatch(env)
    assert done.returncode == PREEMPTED, done.stderr
    assert "error: preempted: the run saved a checkpoint and stopped" in done.stderr
    assert (tmp_path / "requeued").read_text() == "requeue 4242\n"
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_00000002"]
    assert (checkpoints / "step_00000002" / ".metadata").is_file()
