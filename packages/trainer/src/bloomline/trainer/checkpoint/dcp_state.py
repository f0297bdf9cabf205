"""What DCP writes and reads: the model and optimizer state by parameter name, and DCP's calls
without its single-process warning.

Apart from the save and the load because both (and the background save, ``async_save.py``)
must hand DCP the same state dict, built the same way: a save and a load that flattened the
optimizer state differently would load the wrong parameter groups.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from bloomline.trainer.master_weights import master_weights_of

__all__ = ["dcp_quiet", "model_state_target", "saved_state_dict", "state_dict_options"]

# DCP warns on every call without a process group that it assumes a single process; that is
# intended here. A process-wide filter for the async save, which calls DCP from a background
# thread (a catch_warnings block is not thread-safe and is gone by then); ``dcp_quiet`` for the
# calls in this thread, where a test harness may have reset the filters.
_DCP_SINGLE_PROCESS = ".*torch.distributed is disabled.*"
warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)


@contextlib.contextmanager
def dcp_quiet() -> Iterator[None]:
    """DCP's calls in this thread without its single-process warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)
        yield


def state_dict_options():
    """Optimizer state flattened to one entry per parameter name (``state.NAME.exp_avg``,
    ``param_groups.NAME.lr``): pipeline stages hold different parameter groups, and DCP would
    keep one rank's unflattened ``param_groups`` list for all of them (loading the wrong
    groups on the other stages); by name, it reshards across layouts as the tensors do."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def saved_state_dict(model, optimizer) -> dict:
    """What DCP writes: {"model": ..., "optim": ...} (live tensors, not copies).

    An optimizer that has not stepped yet has no state to save, so DCP's ``get_state_dict``
    creates it with a zero-lr ``step()``: Adam's moments stay zero but its step counter reads
    1, and the first real update would use the second step's bias correction. That counter
    is set back to 0 (in the optimizer and in what is saved): a step that did not happen is
    never recorded."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_state_dict

    never_stepped = not optimizer.state
    if master_weights_of(model) is not None:  # the buffers engine: its fp32 masters are saved
        model_state = model_state_target(model)
        optim_state = get_optimizer_state_dict(model, optimizer, options=state_dict_options())
    else:
        model_state, optim_state = get_state_dict(model, optimizer,
                                                  options=state_dict_options())
    if never_stepped:
        for state in [*optimizer.state.values(), optim_state]:
            _zero_step_counters(state)
    return {"model": model_state, "optim": optim_state}


def model_state_target(model) -> dict:
    """The model's state as DCP saves and loads it (live tensors): on the buffers engine
    (``parallel/distributed_optimizer.py``) the fp32 master pieces under the parameters'
    names, not the compute-dtype parameters: the checkpoint keeps full precision and the
    layout of the FSDP2 engine's checkpoints (fp32 tensors of the global shapes)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model)
    engine = master_weights_of(model)
    if engine is not None:
        names = {param: name for name, param in model.named_parameters()}
        masters = engine.master_state(names)
        unknown = set(masters) - set(state)
        if unknown:  # the state dict renamed a parameter: DCP would save it twice
            raise RuntimeError(f"parameter names outside the model's state dict: {unknown}")
        state.update(masters)
    return state


def _zero_step_counters(state: dict) -> None:
    """Set the ``step`` entries (Adam/LAMB's per-parameter counter) of a parameter's state, or
    of a flattened optimizer state dict (``state.NAME.step``), to 0."""
    for key, value in state.items():
        if key == "step" or key.endswith(".step"):
            if isinstance(value, torch.Tensor):
                value.zero_()
            else:
                state[key] = 0
