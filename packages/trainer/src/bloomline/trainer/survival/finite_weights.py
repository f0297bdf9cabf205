"""Weights that hold NaN or inf are never trained from nor saved.

A run whose weights are non-finite cannot make progress: every step's loss is NaN, every step
is skipped, and before this check such a run saved the NaN weights as a checkpoint, rolled back
to it, skipped the rest of its data and reported "completed". So the trainer checks the
weights it starts from (a resumed checkpoint, ``checkpoint.init_from``) and the weights it is
about to save, and stops with one line naming the tensor instead.

Every rank checks its own shards and the ranks agree (one all-reduce), so all of them stop at
the same point: a rank that stopped alone would leave the others in the next collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from bloomline.common.errors import UserError

__all__ = ["check_finite_weights", "first_nonfinite_parameter"]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def first_nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """The name of this rank's first parameter (its local shard) holding NaN or inf; None
    when all are finite. One device synchronization, not one per parameter."""
    named = [(name, _local(p.detach())) for name, p in model.named_parameters()]
    named = [(name, t) for name, t in named if t.numel() and t.is_floating_point()
             and t.device.type != "meta"]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(t).all() for _, t in named]).cpu()
    bad = (~finite).nonzero()
    return named[int(bad[0])][0] if len(bad) else None


def check_finite_weights(model: torch.nn.Module, what: str, advice: str) -> None:
    """Raise a one-line ``UserError`` on every rank when any rank's parameters hold NaN or
    inf (collective: every rank calls it at the same point). ``what`` says whose weights
    (``"checkpoint step_00000200"``), ``advice`` what to do."""
    name = first_nonfinite_parameter(model)
    found = name is not None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([float(found)], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not found:
            raise UserError(f"{what}: weights on another rank hold NaN or inf; {advice}")
    if found:
        raise UserError(f"{what}: parameter {name} holds NaN or inf; {advice}")
