"""Check b: one bf16 run of ``configs/350m.toml`` on one GPU, as ``trainer pretrain`` runs it.

The recipe's model, micro-batch and sequence length, bf16, on the demo corpus, for
:data:`STEPS` optimizer steps of one micro-batch each (the first compiles the attention
kernel; the later ones give the step time). It checks what a first GPU run can get wrong
before any throughput matters: the command exits 0, every step logs a finite loss, the first
loss is that of an untrained model (near ln(vocabulary): :data:`INIT_BAND`), and the peak
memory is reported.

Contract: :func:`check_one_step` returns one :class:`Row`; ``overrides`` go after the check's
own (a CPU dry run of the plumbing: ``train.device=cpu data.seq_length=256``).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from benchmarks.gpu_check.results import FAIL, PASS, Row
from benchmarks.gpu_check.trainer_runs import ensure_demo_corpus, pretrain

__all__ = ["INIT_BAND", "STEPS", "check_one_step"]

STEPS = 3
# The first loss minus ln(vocab): an untrained model's logits are not all zero (BLOOM's init
# with a unit-variance final LayerNorm gives logits of std ~1, which adds about var/2), and the
# demo corpus uses 8000 of the 50304 rows, which does not change an untrained model's loss.
# A first loss outside this band means a wrong loss (mean over the wrong axis, a missing
# shift of the labels, a vocab mismatch) or a broken init.
INIT_BAND = (-0.5, 1.5)


def check_one_step(config: str = "configs/350m.toml", overrides: tuple[str, ...] = (),
                   timeout: float = 1800) -> Row:
    """Run ``config`` for :data:`STEPS` steps in a temporary run folder and judge it."""
    import tomllib

    recipe = tomllib.loads(Path(config).read_text())
    micro = recipe["train"]["micro_batch_size"]
    vocab = recipe["model"]["vocab_size"]
    name = f"one bf16 run of {Path(config).stem}"
    settings = [*ensure_demo_corpus(), "precision.dtype=bf16",
                f"train.global_batch_size={micro}", f"train.train_samples={STEPS * micro}",
                "train.log_interval=1", "schedule.warmup=0",
                # the recipe's 1/1000 test share of the small demo corpus holds no sample of
                # L + 1 tokens, and the trainer refuses an empty split; no evaluation runs
                "data.split=98,2,0", *overrides]
    with tempfile.TemporaryDirectory(prefix="gpu_check_step_") as tmp:
        run = pretrain(config, Path(tmp) / "run", settings, timeout=timeout)
    tolerance = f"loss1 - ln V in {INIT_BAND}"
    if not run.ok:
        return Row(name, FAIL, tolerance=tolerance,
                   detail=f"exit {run.returncode}: {run.output_tail}")
    losses = [r["loss"] for r in run.records]
    first = run.records[0]
    excess = first["loss"] - math.log(vocab)
    later = [r["step_time_s"] for r in run.records[1:]] or [first["step_time_s"]]
    memory = max(r.get("memory_gb") or 0.0 for r in run.records)
    figures = (f"losses {', '.join(f'{x:.3f}' for x in losses)} (ln V {math.log(vocab):.3f}); "
               f"step {statistics.median(later):.3f} s after the first "
               f"({first['step_time_s']:.1f} s), {first['seq_length'] * micro:,} tokens/step; "
               f"peak memory {memory:.1f} GB")
    problems = []
    if [r["step"] for r in run.records] != list(range(1, STEPS + 1)):
        problems.append(f"logged steps {[r['step'] for r in run.records]}")
    if not all(math.isfinite(x) for x in losses):
        problems.append("a non-finite loss")
    if not INIT_BAND[0] <= excess <= INIT_BAND[1]:
        problems.append(f"first loss {excess:+.2f} from ln V")
    if memory <= 0:
        problems.append("no peak memory in metrics.jsonl")
    return Row(name, FAIL if problems else PASS, figures, tolerance, "; ".join(problems))
