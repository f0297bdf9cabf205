"""The training state as this rank holds it: the tensors a checkpoint saves
(``checkpoint.dcp_state.saved_state_dict``: the model, or the buffers engine's fp32 masters,
and the optimizer), each as this rank's local piece, with the non-tensor entries apart.

Why not DCP: a snapshot is restored into the same layout it was taken from (same world, same
mesh, same rank), so each rank's local pieces are the whole story and nothing needs the
global index, planning or resharding DCP does. Why the checkpoint's state dict all the same:
a restore then goes through the very tail a checkpoint load uses
(``checkpoint.load.apply_loaded_state``), so a run continued from a snapshot is the run
continued from a checkpoint of the same step, bit for bit.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from bloomline.trainer.checkpoint.dcp_state import saved_state_dict
from bloomline.trainer.checkpoint.load import apply_loaded_state

__all__ = ["flat_state", "local_tensor", "restore_state"]


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``value`` (a DTensor's local tensor, which aliases its storage:
    writing into it writes the DTensor), or ``value`` itself."""
    return value._local_tensor if isinstance(value, DTensor) else value


def flat_state(model, optimizer) -> tuple[dict[str, torch.Tensor], dict[str, object], dict]:
    """(tensors, values, nested): the live state flattened to dotted names (``model.NAME``,
    ``optim.state.NAME.exp_avg``), tensors as this rank's local pieces (live: not copies),
    the other entries (the optimizer's flattened param groups) apart, and the nested state
    dict they came from, with its flattening map, for ``restore_state``."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    state = saved_state_dict(model, optimizer)
    flat, mapping = flatten_state_dict(state)
    tensors = {name: local_tensor(value) for name, value in flat.items()
               if isinstance(value, torch.Tensor)}
    values = {name: value for name, value in flat.items() if not isinstance(value, torch.Tensor)}
    return tensors, values, {"flat": flat, "mapping": mapping}


@torch.no_grad()
def restore_state(model, optimizer, tensors: dict[str, torch.Tensor],
                  values: dict[str, object]) -> None:
    """Load ``tensors`` (this rank's local pieces, by the names ``flat_state`` gives) and
    ``values`` into the model and optimizer, as a checkpoint load would.

    Raises:
        ValueError: The names, shapes or dtypes differ from the live state's (a snapshot of
            another model or layout); nothing was changed then.
    """
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict

    live, live_values, nested = flat_state(model, optimizer)
    problems = _differences(live, tensors) + [
        f"{name}: missing" for name in sorted(set(live_values) - set(values))]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{problems[0]}{more}")
    for name, target in live.items():
        target.copy_(tensors[name])
    flat = dict(nested["flat"])
    flat.update({name: values[name] for name in live_values})
    apply_loaded_state(model, optimizer, unflatten_state_dict(flat, nested["mapping"]))


def _differences(live: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> list[str]:
    problems = [f"{name}: missing" for name in sorted(set(live) - set(saved))]
    problems += [f"{name}: not in this model" for name in sorted(set(saved) - set(live))]
    for name in sorted(set(live) & set(saved)):
        a, b = live[name], saved[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{name}: {b.dtype} {list(b.shape)} saved, "
                            f"{a.dtype} {list(a.shape)} here")
    return problems
