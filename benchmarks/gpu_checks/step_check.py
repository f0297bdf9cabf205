"""Check b: a short bf16 run of ``configs/350m.toml`` on one GPU, as ``trainer pretrain`` runs
it, with ``trainer plan``'s prediction for the same run beside it.

The recipe's model, micro-batch (8) and sequence length (2048), bf16, on the demo corpus, on one
GPU (``parallel.world_size=1`` in place of the recipe's 8), for :data:`STEPS` optimizer steps of
:data:`MICRO_BATCHES` micro-batches each (gradient accumulation included; the first step
compiles). It checks what a first GPU run can get wrong before any throughput matters: the
command exits 0, every step logs a finite loss, the first loss is not below ln(vocabulary) by
more than :data:`FLOOR_MARGIN`, the loss falls by the last step, and the peak memory is
reported. It measures, as medians over the steps after the first :data:`WARMUP`: tokens/s, step
time, the logged MFU, and the peak memory (``torch.cuda.max_memory_allocated``).

Beside it, ``trainer plan --json`` for the same recipe, GPU count (1), device, batch and length
(``trainer_runs.start_plan``, started before the run: it traces on the CPU while the GPU trains):
its predicted step time and traced peak memory, and the ratios measured / predicted. The plan
is not judged against the run (the ratios are what the check is for); its row fails only when
the plan itself fails.

Why a floor and not a band around ln(vocabulary): an untrained model of this recipe does not
predict uniformly. The head is tied to the embedding and the residual stream at init is mostly
the (LayerNorm-ed) embedding of the input token, so the input token's own logit is about
hidden_size x init std = sqrt(2 hidden_size / 5) (20 for 350m), the other logits near 0, and
the first loss lies near that logit, far above ln V (measured on CPU: benchmarks/README.md).
What no untrained model can do is beat the uniform guess: a first loss well below ln V means
the labels leak into the inputs (unshifted labels score the copied token).

Contract: :func:`check_one_gpu_run` returns two :class:`Row` (the run, the plan beside it);
``overrides`` go after the check's own, to the run and the plan alike (a CPU dry run of the
plumbing: the tiny recipe with ``train.device=cpu precision.dtype=fp32 data.seq_length=128``).
``budget_s`` bounds the run and the plan (a run past it fails its row).
"""

from __future__ import annotations

import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_checks.results import FAIL, PASS, Row
from benchmarks.gpu_checks.trainer_runs import (
    ensure_demo_corpus,
    plan_result,
    pretrain,
    start_plan,
    stop,
)
from benchmarks.harness.paths import REPO

__all__ = ["FLOOR_MARGIN", "MICRO_BATCHES", "STEPS", "WARMUP", "beside", "check_one_gpu_run",
           "judge"]

STEPS = 8
WARMUP = 3  # steps left out of the medians: compilation, allocator and cuBLAS warm-up
MICRO_BATCHES = 4  # per step: the accumulation path, and steps long enough to time
# how far below ln(vocabulary) the first loss may lie: the demo text is not uniform over the
# 50304 rows (8000 are used), but an untrained model knows nothing of that
FLOOR_MARGIN = 0.5
TOLERANCE = f"loss1 >= ln V - {FLOOR_MARGIN}; falls"
_GB = 1e9  # metrics.jsonl's memory_gb is in 1e9 bytes; the plan's bytes are shown alike


def _recipe(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def _vocabulary(run_dir: Path, recipe: dict) -> int:
    """The rows the run trained with: its saved, resolved config's (a recipe's 0 means "the
    tokenizer's, padded"), else the recipe's."""
    saved = run_dir / "config.toml"
    if saved.is_file():
        return _recipe(saved)["model"]["vocab_size"]
    return recipe["model"]["vocab_size"]


def check_one_gpu_run(gpu: str, config: str = "configs/350m.toml",
                      overrides: tuple[str, ...] = (), budget_s: float = 270) -> list[Row]:
    """Run ``config`` on one device for :data:`STEPS` steps in a temporary run folder, the plan
    for the same run on device ``gpu`` (a key of the plan's device table) meanwhile; judge
    the run, put the plan beside it."""
    began = time.monotonic()
    recipe = _recipe(REPO / config)  # an absolute config stays itself
    micro = recipe["train"]["micro_batch_size"]
    batch = micro * MICRO_BATCHES
    # one GPU: the recipe's [parallel] layout is for its parallel.world_size (350m: 8)
    shared = ["precision.dtype=bf16", f"train.global_batch_size={batch}",
              "parallel.world_size=1", *overrides]
    dtype = [s.split("=", 1)[1] for s in shared if s.startswith("precision.dtype=")][-1]
    name = f"one {dtype} run of {Path(config).stem}"
    settings = [*ensure_demo_corpus(), f"train.train_samples={STEPS * batch}",
                "train.log_interval=1", "schedule.warmup=0",
                # the recipe's 1/1000 test share of the small demo corpus holds no sample of
                # L + 1 tokens, and the trainer refuses an empty split; no evaluation runs
                "data.split=98,2,0", *shared]
    planning = start_plan(config, 1, gpu, shared)
    failure = None
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_check_step_") as tmp:
            run = pretrain(config, Path(tmp) / "run", settings,
                           timeout=budget_s - (time.monotonic() - began))
            vocab = _vocabulary(Path(tmp) / "run", recipe)
        if not run.ok:
            failure = f"exit {run.returncode}: {run.output_tail}"
    except subprocess.TimeoutExpired:
        failure = f"the run did not finish within the check's {budget_s:.0f} s budget"
    if failure:
        stop(planning)
        return [Row(name, FAIL, tolerance=TOLERANCE, detail=failure),
                Row(f"plan beside {name}", FAIL, detail="not compared: the run failed")]
    row, measured = judge(name, run.records, vocab)
    try:
        plan = plan_result(planning, budget_s - (time.monotonic() - began))
    except (RuntimeError, ValueError) as error:
        return [row, Row(f"plan beside {name}", FAIL, tolerance="none (reported)",
                         detail=str(error))]
    return [row, beside(f"plan beside {name}", measured, plan, gpu)]


def judge(name: str, records: list[dict], vocab: int, steps: int = STEPS,
          warmup: int = WARMUP) -> tuple[Row, dict]:
    """The row for a finished run's ``train`` records (``metrics.jsonl``), one per step, and
    the medians it measured (``step_time_s``, ``tokens_per_s``, ``mfu``, ``memory_gb``)."""
    losses = [r["loss"] for r in records]
    first = records[0]
    excess = first["loss"] - math.log(vocab)
    kept = records[warmup:] or records[-1:]
    measured = {key: statistics.median(r.get(key) or 0.0 for r in kept)
                for key in ("step_time_s", "tokens_per_s", "mfu")}
    measured["memory_gb"] = max(r.get("memory_gb") or 0.0 for r in records)
    tokens = first["seq_length"] * first["global_batch_size"]
    figures = (f"losses {', '.join(f'{x:.3f}' for x in losses)} (ln V {math.log(vocab):.3f}); "
               f"median of steps {warmup + 1}-{len(records)}: "
               f"{measured['tokens_per_s']:,.0f} tokens/s, step {measured['step_time_s']:.3f} s "
               f"(first {first['step_time_s']:.1f} s), MFU {100 * measured['mfu']:.1f}%; "
               f"{tokens:,} tokens/step; peak memory {measured['memory_gb']:.1f} GB")
    problems = []
    if [r["step"] for r in records] != list(range(1, steps + 1)):
        problems.append(f"logged steps {[r['step'] for r in records]}")
    if not all(math.isfinite(x) for x in losses):
        problems.append("a non-finite loss")
    elif excess < -FLOOR_MARGIN:
        problems.append(f"first loss {excess:+.2f} from ln V: below uniform (labels leak?)")
    elif len(losses) > 1 and not losses[-1] < losses[0]:
        problems.append("the loss did not fall")
    if measured["memory_gb"] <= 0:
        problems.append("no peak memory in metrics.jsonl")
    return Row(name, FAIL if problems else PASS, figures, TOLERANCE, "; ".join(problems)), \
        measured


def beside(name: str, measured: dict, plan: dict, gpu: str) -> Row:
    """The plan's step time and traced peak memory next to the measured ones, as ratios."""
    memory = plan["ranks"][0]["memory_bytes"]["total"] / _GB
    step = plan["step_time_s"]
    figures = (f"plan ({gpu}): step {step:.3g} s, MFU {100 * plan['mfu']:.1f}%, peak memory "
               f"{memory:.1f} GB ({'traced' if plan.get('traced') else 'formulas'}); "
               f"measured/plan: step time {measured['step_time_s'] / step:.3g}, "
               f"memory {measured['memory_gb'] / memory:.3g}")
    return Row(name, PASS, figures, "none (reported)")
