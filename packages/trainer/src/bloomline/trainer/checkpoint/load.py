"""Loading a checkpoint: verified against its manifest first, then the model (and optimizer)
state through DCP, the RNG states, and the trainer state returned.

Apart from the save because a load has a contract of its own: nothing in a checkpoint is read
before the checkpoint verifies (DCP unpickles ``.metadata``), and every pickle is read through
the restricted unpickler (``metadata.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular
from bloomline.trainer.checkpoint.dcp_state import (
    dcp_quiet,
    model_state_target,
    saved_state_dict,
    state_dict_options,
)
from bloomline.trainer.checkpoint.layout import CONFIG_FILE, RNG_FILE, STATE_FILE
from bloomline.trainer.checkpoint.manifest import refuse_damaged, verify_checkpoint
from bloomline.trainer.checkpoint.metadata import dcp_load, read_metadata
from bloomline.trainer.checkpoint.rng_state import rng_problems, set_rng_state
from bloomline.trainer.master_weights import master_weights_of
from bloomline.trainer.train_state import TrainState

__all__ = ["apply_loaded_state", "load_checkpoint"]


def load_checkpoint(checkpoint: str | Path, model, optimizer=None, verified: bool = False,
                    group=None) -> dict:
    """Load model (and optimizer) state and the RNG states; returns the trainer state.

    The checkpoint is verified against its manifest first (DCP unpickles ``.metadata``: a
    damaged or swapped file must be refused before that), unless the caller has just done so
    (``latest_checkpoint`` returns verified checkpoints: pass ``verified=True``). Collective
    when the process group is up.

    Raises:
        UserError: The checkpoint does not verify (names its first problem), or a pickle of
            it names a global outside DCP's classes (``TamperedCheckpointError``).
    """
    checkpoint = Path(checkpoint)
    if not verified:
        refuse_damaged(checkpoint, verify_checkpoint(checkpoint, group))
    # the small files first, checked as the manifest's verification checks them (a caller
    # may have verified another copy), before any tensor is read
    trainer_state = _read_checked(checkpoint / STATE_FILE, TrainState.problems)
    rng = _read_checked(checkpoint / RNG_FILE, rng_problems) if optimizer is not None else None
    if optimizer is None:
        state = {"model": model_state_target(model)}
    else:
        state = saved_state_dict(model, optimizer)
    _check_shapes(state, checkpoint)
    with dcp_quiet():  # DCP's pickles read with DCP's classes only (metadata.py)
        dcp_load(state, checkpoint)
    apply_loaded_state(model, optimizer, state)
    if rng is not None:
        set_rng_state(rng)
    return trainer_state


def apply_loaded_state(model, optimizer, state: dict) -> None:
    """Hand ``state`` (what ``saved_state_dict`` / ``model_state_target`` returned, its
    tensors filled in place by a load) to the model and optimizer: the one tail of every
    load, from a checkpoint here or from an in-memory snapshot (``local_shards.py``)."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    engine = master_weights_of(model)  # the buffers engine loads into its masters
    if engine is not None:
        # the masters were loaded in place; the parameters are their compute-dtype copies
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state["optim"],
                                     options=state_dict_options())
        engine.publish()
    elif optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=state_dict_options())


def _read_checked(path: Path, problems_of) -> dict:
    """A small JSON file of the checkpoint, refused in one line (the file and its first
    problem) when it does not parse or ``problems_of`` finds a field it cannot load."""
    try:
        with open_regular(path, "checkpoint file") as fh:
            value = json.loads(fh.read())
    except (ValueError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"{path}: does not parse ({err}); resume from another "
                        "checkpoint") from None
    problems = problems_of(value)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{path}: {problems[0]}{more}; not what a save writes: use another "
                        "checkpoint")
    return value


def _check_shapes(state: dict, checkpoint: Path) -> None:
    """Every tensor to load has the shape the checkpoint's metadata gives it, else a one-line
    ``UserError`` naming the tensor and both shapes (DCP fails with a multi-rank traceback,
    after allocating what the metadata claims)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = read_metadata(checkpoint).state_dict_metadata
    # the model's tensors (global shapes in every layout); the optimizer's follow them
    flat, _ = flatten_state_dict({"model": state["model"]})
    for fqn, value in flat.items():
        item = saved.get(fqn)
        if isinstance(value, torch.Tensor) and isinstance(item, TensorStorageMetadata) \
                and tuple(item.size) != tuple(value.shape):
            raise UserError(f"{checkpoint}: tensor {fqn} has shape {list(item.size)} in the "
                            f"checkpoint, the model built from the config expects "
                            f"{list(value.shape)}; the checkpoint's tensors and its "
                            f"{CONFIG_FILE} disagree: it was not written by a bloomline save")
