"""Check d: ``benchmarks/gpu_throughput.sh``'s measured step time with ``trainer plan``'s
prediction for the same recipe, world size and GPU beside it.

The time model (``bloomline.trainer.plan``) was calibrated against published runs; this is its
first comparison with a run of this trainer. Nothing is judged against the prediction (the
ratio is what is being learned); a row fails only when the run or the plan fails.

Contract: :func:`check_throughput` runs the script (``os.environ`` passes through: ``STEPS``,
``CONFIGS``, ``NGPU``, ...; ``overrides`` go to both the script and the plan), reads the JSON
line per recipe it appends to ``RESULTS``, and returns one :class:`Row` per recipe: measured
step time, tokens/s and MFU, the plan's, and measured / predicted step time.
:func:`plan_prediction` is ``trainer plan --json`` for one recipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.gpu_checks.results import FAIL, PASS, SKIPPED, Row
from benchmarks.gpu_checks.trainer_runs import plan_result, start_plan
from benchmarks.harness.paths import REPO

__all__ = ["check_throughput", "plan_prediction"]

SCRIPT = REPO / "benchmarks" / "gpu_throughput.sh"


def plan_prediction(config: str, gpus: int, gpu: str, overrides: list[str]) -> dict:
    """``trainer plan --json`` for one recipe at ``gpus`` GPUs of one node (its
    ``step_time_s``, ``tokens_per_s``, ``mfu``, ...); raises RuntimeError with its last line."""
    return plan_result(start_plan(config, gpus, gpu, overrides))


def _row(measured: dict, gpu: str, note: str, overrides: list[str]) -> Row:
    name = f"throughput {Path(measured['config']).stem} x{measured['gpus']}"
    # the plan sees what the run ran: its global batch and length, then the same overrides
    settings = [f"train.global_batch_size={measured['global_batch_size']}",
                f"data.seq_length={measured['seq_length']}", *overrides]
    ran = (f"measured step {measured['step_time_s']:.3f} s, "
           f"{measured['tokens_per_s']:,.0f} tok/s, MFU {100 * measured['mfu']:.1f}%")
    try:
        plan = plan_prediction(measured["config"], measured["gpus"], gpu, settings)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as error:
        return Row(name, FAIL, ran, "none (reported)", f"plan: {error}")
    ratio = measured["step_time_s"] / plan["step_time_s"]
    figures = (f"{ran}; plan ({gpu}) step {plan['step_time_s']:.3g} s, "
               f"{plan['tokens_per_s']:,.0f} tok/s, MFU {100 * plan['mfu']:.1f}%; "
               f"measured/plan step time {ratio:.3g}")
    return Row(name, PASS, figures, "none (reported)", note)


def check_throughput(gpu: str, note: str = "", overrides: tuple[str, ...] = (),
                     timeout: float = 7200, env: dict | None = None) -> list[Row]:
    """Run the script, then one row per recipe it measured. ``gpu``: the plan's device key
    (``plan_device``); ``note``: its caveat, shown on every row; ``env``: settings of the
    script over ``os.environ``'s (a CPU dry run: ``DEVICE=cpu``)."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_throughput_") as tmp:
        results = Path(tmp) / "results.jsonl"
        env = dict(os.environ, **(env or {}), RESULTS=str(results), PY=sys.executable)
        # its table goes straight to the terminal as it prints it (the runs take minutes);
        # stderr is kept for the one line of its no-GPU exit
        done = subprocess.run(["bash", str(SCRIPT), *overrides], cwd=REPO, env=env,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
        print(done.stderr, end="", file=sys.stderr)
        measured = [json.loads(line) for line in results.read_text().splitlines()] \
            if results.is_file() else []
    if done.returncode == 2 and not measured:
        line = (done.stderr.strip().splitlines() or ["exit 2"])[0]
        return [Row("throughput", SKIPPED, detail=line)]
    rows = [_row(m, gpu, note, list(overrides)) for m in measured]
    if done.returncode != 0:
        rows.append(Row("throughput", FAIL, detail=f"gpu_throughput.sh exit {done.returncode}"))
    return rows or [Row("throughput", FAIL, detail="gpu_throughput.sh measured nothing")]
