"""Check c: data and tensor parallelism over NCCL train as one GPU does.

The CPU tests prove the layouts on gloo; here the same trainer runs them on GPUs, where the
collectives are NCCL's and the kernels cuBLAS's and FlexAttention's. Three runs of the tiny
recipe (``configs/tiny-cpu.toml``'s shape) in fp32 for :data:`STEPS` steps: one GPU, then
``trainer pretrain --nproc 2`` with ``parallel.data_parallel=2`` and with
``parallel.tensor_parallel=2``; each 2-GPU run's per-step losses and gradient norms (its
``metrics.jsonl``) must be within :data:`LOSS_RTOL` and :data:`GRAD_NORM_RTOL` of the
one-GPU run's.

Contract: :func:`check_layouts` returns one :class:`Row` per layout, ``skipped`` (with the
reason) when fewer than 2 GPUs are visible.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.gpu_checks.results import FAIL, PASS, SKIPPED, Row
from benchmarks.gpu_checks.trainer_runs import compare_losses, ensure_demo_corpus, pretrain

__all__ = ["GRAD_NORM_RTOL", "LAYOUTS", "LOSS_RTOL", "STEPS", "check_layouts"]

STEPS = 5
# The CPU tests hold these layouts to 1e-5 on gloo; on GPUs cuBLAS picks algorithms by shape
# (tp halves the shapes), FlexAttention tiles by head count and NCCL sums in its own order,
# all fp32 roundoff that compounds over the steps. A layout bug (a rank stepping on its own
# half of the batch, a tp shard misplaced) changes the update itself, far above roundoff.
LOSS_RTOL = 1e-4
# The gradient norm (before clipping) is compared too: gradients summed instead of averaged
# over dp double it, while Adam's per-element normalization hides that from the loss. Looser:
# an fp32 norm of a large tensor is off by about LOSS_RTOL (on CPU, measured in
# benchmarks/README.md) and tp's shards are smaller tensors than one process's, while a
# doubled norm is 1.0 off.
GRAD_NORM_RTOL = 1e-3
LAYOUTS = {"dp2": "parallel.data_parallel=2", "tp2": "parallel.tensor_parallel=2"}
RECIPE = "configs/tiny-cpu.toml"


def _settings() -> list[str]:
    return [*ensure_demo_corpus(),
            # 8000 tokens pad to 8064 rows at tp1 but 8192 at tp2 (a multiple of 128 x tp):
            # the same rows everywhere, or the runs start from different weights
            "model.vocab_size=8192",
            "precision.dtype=fp32",
            "train.micro_batch_size=4", "train.global_batch_size=16",
            f"train.train_samples={16 * STEPS}", "train.log_interval=1",
            "schedule.warmup=0",
            # Adam divides by each gradient's own size: elements whose gradient is zero up to
            # roundoff (the key bias) would step by +-lr on the roundoff's sign (as in the CPU
            # tensor-parallel tests)
            "optimizer.eps=1e-6"]


def check_layouts(gpus: int, overrides: tuple[str, ...] = (),
                  timeout: float = 1800) -> list[Row]:
    """The one-GPU run and, with ``gpus >= 2``, each layout of :data:`LAYOUTS` against it.
    ``overrides`` go after the check's own (a CPU dry run on gloo: ``train.device=cpu``)."""
    tolerance = f"rel: loss {LOSS_RTOL:.0e}, grad norm {GRAD_NORM_RTOL:.0e}"
    if gpus < 2:
        return [Row(f"nccl {name} vs 1 GPU", SKIPPED, tolerance=tolerance,
                    detail=f"{gpus} GPU: needs 2") for name in LAYOUTS]
    settings = [*_settings(), *overrides]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_layouts_") as tmp:
        one = pretrain(RECIPE, Path(tmp) / "one", settings, timeout=timeout)
        for name, layout in LAYOUTS.items():
            label = f"nccl {name} vs 1 GPU"
            if not one.ok:
                rows.append(Row(label, FAIL, tolerance=tolerance,
                                detail=f"the 1-GPU run: exit {one.returncode}: "
                                       f"{one.output_tail}"))
                continue
            # the recipe's layout is for 1 process: this one is for 2
            run = pretrain(RECIPE, Path(tmp) / name,
                           [*settings, "parallel.world_size=2", layout], nproc=2,
                           timeout=timeout)
            if not run.ok:
                rows.append(Row(label, FAIL, tolerance=tolerance,
                                detail=f"exit {run.returncode}: {run.output_tail}"))
                continue
            loss = compare_losses(run.records, one.records, LOSS_RTOL)
            norm = compare_losses(run.records, one.records, GRAD_NORM_RTOL, key="grad_norm")
            figures = (f"{len(run.records)} steps, worst loss {loss.worst:.1e} (step "
                       f"{loss.worst_step}), grad norm {norm.worst:.1e} (step "
                       f"{norm.worst_step}); last loss {run.records[-1]['loss']:.5f} vs "
                       f"{one.records[-1]['loss']:.5f}")
            problems = [p for p in (loss.problem, norm.problem) if p]
            rows.append(Row(label, FAIL if problems else PASS, figures, tolerance,
                            "; ".join(problems)))
    return rows
