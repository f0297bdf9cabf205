"""`trainer pretrain` and `trainer plan` as the GPU checks run them: the demo corpus, one run in
a subprocess, its per-step records, the comparison of two runs' losses, the plan of a run.

The checks judge the trainer by what it writes (``metrics.jsonl``), so they test the real
command, launcher included, rather than a copy of its loop.

Contract: :func:`ensure_demo_corpus` builds ``build/demo`` offline with the commands
``benchmarks/gpu_throughput.sh`` uses when it has no token files and returns the overrides
that point a recipe at it. :func:`pretrain` returns a :class:`Run` (exit status, the ``train``
records of ``metrics.jsonl``, the end of the output). :func:`compare_losses` says whether two
runs logged the same steps with losses (or another per-step value) within a relative
tolerance. :func:`start_plan` starts ``trainer plan --json`` in the background (it traces on
the CPU, so it can run while a GPU trains) and :func:`plan_result` reads it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.paths import REPO

__all__ = ["DEMO", "LossComparison", "Run", "compare_losses", "ensure_demo_corpus",
           "plan_result", "pretrain", "start_plan", "stop", "train_records"]

DEMO = REPO / "build" / "demo"
# what the runs of these checks never need: evaluation, TensorBoard, activation stats, a
# resume from an earlier run's checkpoint
QUIET = ["train.eval_interval=0", "monitor.tensorboard=false",
         "monitor.activation_stats_interval=0", "checkpoint.interval=0", "checkpoint.resume=none"]


def _start(args: list[str]) -> subprocess.Popen:
    """``args`` with its output captured, in a process group of its own, so that :func:`stop`
    can end what it started too."""
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """Kill ``process`` and its process group, and reap it. The group matters: killing the
    trainer alone leaves its multiprocessing helpers (the resource tracker, loader workers,
    the plan's forkserver) holding the output pipes, and reading them would never end."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(args, timeout=...)`` that ends the whole group when it times out (or
    the check is interrupted), then raises as ``subprocess.run`` does."""
    process = _start(args)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        stop(process)
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def ensure_demo_corpus(timeout: float = 1800) -> list[str]:
    """The demo corpus and tokenizer (built when ``build/demo/corpus`` has no ``.idx``), as
    ``data.corpus`` / ``data.tokenizer`` overrides."""
    if not list((DEMO / "corpus").glob("*.idx")):
        dataprep = [sys.executable, "-m", "bloomline.dataprep.cli"]
        for args in (["demo-corpus", str(DEMO / "raw"), "--overwrite"],
                     ["train-tokenizer", str(DEMO / "raw"), "--vocab-size", "8000",
                      "--output", str(DEMO / "tokenizer" / "demo"), "--overwrite"],
                     ["tokenize", str(DEMO / "raw"), "--tokenizer",
                      str(DEMO / "tokenizer" / "demo.model"), "--output",
                      str(DEMO / "corpus" / "demo"), "--overwrite"]):
            done = _run([*dataprep, *args], timeout)
            if done.returncode != 0:
                raise RuntimeError(f"dataprep {args[0]} failed: {_tail(done)}")
    return [f"data.corpus={DEMO / 'corpus'}", f"data.tokenizer={DEMO / 'tokenizer' / 'demo.model'}"]


@dataclass
class Run:
    """One finished ``trainer pretrain``."""

    returncode: int
    records: list[dict] = field(default_factory=list)
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.records)


def _tail(done: subprocess.CompletedProcess, lines: int = 5) -> str:
    text = (done.stdout or "") + (done.stderr or "")
    return " | ".join(text.strip().splitlines()[-lines:])


def train_records(run_dir: Path) -> list[dict]:
    """The ``kind == "train"`` records of ``run_dir/metrics.jsonl`` (none when it is missing)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "train"]


def pretrain(config: str, run_dir: Path, overrides: list[str], nproc: int = 0,
             timeout: float = 1800) -> Run:
    """``python -m bloomline.trainer pretrain [--nproc N] --config CONFIG`` with the run folder
    ``run_dir``, :data:`QUIET`'s settings and then ``overrides`` (later ones win)."""
    launch = ["--nproc", str(nproc)] if nproc else []
    done = _run([sys.executable, "-m", "bloomline.trainer", "pretrain", *launch,
                 "--config", config, f"train.run_dir={run_dir}", *QUIET, *overrides], timeout)
    return Run(done.returncode, train_records(run_dir), _tail(done))


@dataclass(frozen=True)
class LossComparison:
    """``worst``: the largest |got - want| / |want| over the steps; ``problem``: why the runs
    cannot be compared or differ (None when they match within the tolerance)."""

    worst: float
    worst_step: int
    problem: str | None


def compare_losses(got: list[dict], want: list[dict], rtol: float,
                   key: str = "loss") -> LossComparison:
    """Per-step ``key`` (the loss, or e.g. ``grad_norm``) of ``got`` against ``want`` (records
    as :func:`train_records` reads them): the same logged steps, every value finite, each
    within ``rtol`` of the reference's."""
    got_steps, want_steps = [r["step"] for r in got], [r["step"] for r in want]
    if not want_steps:
        return LossComparison(math.inf, 0, "the reference logged no step")
    if got_steps != want_steps:
        return LossComparison(math.inf, 0, f"steps differ: {got_steps} vs {want_steps}")
    worst, worst_step = 0.0, want_steps[0]
    for mine, ref in zip(got, want, strict=True):
        a, b = float(mine[key]), float(ref[key])
        if not (math.isfinite(a) and math.isfinite(b)):
            return LossComparison(math.inf, ref["step"], f"step {ref['step']}: {key} {a} vs {b}")
        error = abs(a - b) / abs(b)
        if error > worst:
            worst, worst_step = error, ref["step"]
    problem = None
    if worst > rtol:
        problem = f"step {worst_step}: {key} relative difference {worst:.2e} > {rtol:.0e}"
    return LossComparison(worst, worst_step, problem)


def start_plan(config: str, gpus: int, gpu: str, overrides: list[str]) -> subprocess.Popen:
    """Start ``trainer plan --config CONFIG --nodes 1 --gpus-per-node GPUS --gpu GPU --json
    OVERRIDES`` (``gpu``: a key of the plan's device table)."""
    return _start([sys.executable, "-m", "bloomline.trainer", "plan", "--config", config,
                   "--nodes", "1", "--gpus-per-node", str(gpus), "--gpu", gpu, "--json",
                   *overrides])


def plan_result(process: subprocess.Popen, timeout: float = 600) -> dict:
    """The JSON of a :func:`start_plan` (``step_time_s``, ``tokens_per_s``, ``mfu``,
    ``ranks[i].memory_bytes.total``, ...); RuntimeError with its last line when it fails or
    outlives ``timeout`` seconds (then it is killed)."""
    try:
        out, err = process.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        stop(process)
        raise RuntimeError(f"trainer plan did not finish within {timeout:.0f} s") from None
    if process.returncode != 0:
        last = (err or out).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"trainer plan exit {process.returncode}: {last[0]}")
    return json.loads(out)
