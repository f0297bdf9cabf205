"""Check b: one bf16 run of ``configs/350m.toml`` on one GPU, as ``trainer pretrain`` runs it.

The recipe's model, micro-batch and sequence length, bf16, on the demo corpus, for
:data:`STEPS` optimizer steps of one micro-batch each (the first compiles the attention
kernel; the later ones give the step time). It checks what a first GPU run can get wrong
before any throughput matters: the command exits 0, every step logs a finite loss, the first
loss is not below ln(vocabulary) by more than :data:`FLOOR_MARGIN`, the loss falls by the last
step, and the peak memory is reported.

Why a floor and not a band around ln(vocabulary): an untrained model of this recipe does not
predict uniformly. The head is tied to the embedding and the residual stream at init is mostly
the (LayerNorm-ed) embedding of the input token, so the input token's own logit is about
hidden_size x init std = sqrt(2 hidden_size / 5) (20 for 350m), the other logits near 0, and
the first loss lies near that logit, far above ln V (measured on CPU: benchmarks/README.md).
What no untrained model can do is beat the uniform guess: a first loss well below ln V means
the labels leak into the inputs (unshifted labels score the copied token).

Contract: :func:`check_one_step` returns one :class:`Row`; ``overrides`` go after the check's
own (a CPU dry run of the plumbing: ``train.device=cpu data.seq_length=256``).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from benchmarks.gpu_checks.results import FAIL, PASS, Row
from benchmarks.gpu_checks.trainer_runs import ensure_demo_corpus, pretrain
from benchmarks.harness.paths import REPO

__all__ = ["FLOOR_MARGIN", "STEPS", "check_one_step", "judge"]

STEPS = 3
# how far below ln(vocabulary) the first loss may lie: the demo text is not uniform over the
# 50304 rows (8000 are used), but an untrained model knows nothing of that
FLOOR_MARGIN = 0.5
TOLERANCE = f"loss1 >= ln V - {FLOOR_MARGIN}; falls"


def check_one_step(config: str = "configs/350m.toml", overrides: tuple[str, ...] = (),
                   timeout: float = 1800) -> Row:
    """Run ``config`` for :data:`STEPS` steps in a temporary run folder and judge it."""
    import tomllib

    recipe = tomllib.loads((REPO / config).read_text())  # an absolute config stays itself
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
    if not run.ok:
        return Row(name, FAIL, tolerance=TOLERANCE,
                   detail=f"exit {run.returncode}: {run.output_tail}")
    return judge(name, run.records, vocab)


def judge(name: str, records: list[dict], vocab: int) -> Row:
    """The row for a finished run's ``train`` records (``metrics.jsonl``), one per step."""
    losses = [r["loss"] for r in records]
    first = records[0]
    excess = first["loss"] - math.log(vocab)
    later = [r["step_time_s"] for r in records[1:]] or [first["step_time_s"]]
    memory = max(r.get("memory_gb") or 0.0 for r in records)
    tokens = first["seq_length"] * first["global_batch_size"]
    figures = (f"losses {', '.join(f'{x:.3f}' for x in losses)} (ln V {math.log(vocab):.3f}); "
               f"step {statistics.median(later):.3f} s after the first "
               f"({first['step_time_s']:.1f} s), {tokens:,} tokens/step; "
               f"peak memory {memory:.1f} GB")
    problems = []
    if [r["step"] for r in records] != list(range(1, STEPS + 1)):
        problems.append(f"logged steps {[r['step'] for r in records]}")
    if not all(math.isfinite(x) for x in losses):
        problems.append("a non-finite loss")
    elif excess < -FLOOR_MARGIN:
        problems.append(f"first loss {excess:+.2f} from ln V: below uniform (labels leak?)")
    elif len(losses) > 1 and not losses[-1] < losses[0]:
        problems.append("the loss did not fall")
    if memory <= 0:
        problems.append("no peak memory in metrics.jsonl")
    return Row(name, FAIL if problems else PASS, figures, TOLERANCE, "; ".join(problems))
