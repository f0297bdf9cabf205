"""The parts of one optimizer step that every layout shares: the data-parallel reductions of
the step's numbers, clipping, and the step's tail (finite check, result, optimizer step).

``StepRunner.train_step`` (runner.py) calls them in one sequence for the plain and the
pipelined runner, so both take the same skip decision, return the same result keys and step
the optimizer the same way.

Invariant: every rank of the run calls these with the same arguments' shapes, in the same
order (``dp_sum`` is a collective over the data-parallel group).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from bloomline.trainer.losses import source_totals

__all__ = ["clip_grad_norm", "dp_mean", "dp_sum", "finish_step", "set_learning_rate",
           "step_source_totals"]


def dp_sum(value: torch.Tensor, group) -> torch.Tensor:
    """The sum of a per-rank tensor over the data-parallel ``group`` (None: one dp rank, the
    value itself). A copy is reduced: the caller's tensor is left as it was."""
    if group is None:
        return value
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
    return value


def dp_mean(value: torch.Tensor, group) -> torch.Tensor:
    """The mean of a per-rank tensor over the data-parallel ``group`` (the global batch's loss
    from each rank's mean)."""
    if group is None:
        return value
    return dp_sum(value, group) / dist.get_world_size(group)


def step_source_totals(per_sample: torch.Tensor, sources: torch.Tensor, num_sources: int,
                       group) -> torch.Tensor:
    """The global batch's per-source loss sums and counts (``losses.source_totals``) from this
    rank's per-sample losses, summed over the data-parallel ``group``."""
    return dp_sum(source_totals(per_sample, sources, num_sources), group)


def set_learning_rate(optimizer, lr: float) -> None:
    """This step's learning rate in every param group (the schedule is computed outside)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` that also handles DTensor parameters (tp, FSDP2): the norm of
    sharded gradients comes back as a partial DTensor (per-rank partial norms); reduce it to
    the full norm before clipping and before anyone reads it. Returns the norm, a plain tensor."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters], foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm, foreach=True)
    return norm


def max_norm(clip_grad: float) -> float:
    """``optimizer.clip_grad`` as a norm bound: 0 means no clipping."""
    return clip_grad or math.inf


def finish_step(optimizer, scaler, loss: torch.Tensor, grad_norm: torch.Tensor,
                totals: torch.Tensor | None = None,
                activation_stats: Callable[[], dict] | None = None) -> dict:
    """Decide, record and take the step whose gradients are reduced, unscaled and clipped.

    Returns ``loss``, ``grad_norm``, ``skipped`` (the loss or the norm is not finite), with
    ``totals`` its ``source_totals`` list and with ``activation_stats`` its readings (read
    here, before the step: they include per-layer gradient norms). With an fp16 ``scaler``
    the scaler steps, skipping by itself on inf/NaN gradients, and updates its scale; without
    one the optimizer steps only on a finite step. The gradients are dropped either way.
    """
    finite = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(loss))
    result = {"loss": float(loss), "grad_norm": float(grad_norm), "skipped": not finite}
    if totals is not None:
        result["source_totals"] = totals.tolist()
    if activation_stats is not None:
        result["activation_stats"] = activation_stats()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    elif finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return result
