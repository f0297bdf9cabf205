"""Loading a checkpoint: verified against its manifest first, then the model (and optimizer)
state through DCP, the RNG states, and the trainer state returned.

Apart from the save because a load has a contract of its own: nothing in a checkpoint is read
before the checkpoint verifies (DCP unpickles ``.metadata``), and every pickle is read through
the restricted unpickler (``metadata.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.dcp_state import (
    dcp_quiet,
    model_state_target,
    saved_state_dict,
    state_dict_options,
)
from bloomline.trainer.checkpoint.layout import RNG_FILE, STATE_FILE
from bloomline.trainer.checkpoint.manifest import verify_checkpoint
from bloomline.trainer.checkpoint.metadata import dcp_load
from bloomline.trainer.checkpoint.rng_state import set_rng_state
from bloomline.trainer.master_weights import master_weights_of

__all__ = ["load_checkpoint"]


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
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    checkpoint = Path(checkpoint)
    if not verified:
        problems = verify_checkpoint(checkpoint, group)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"{checkpoint}: damaged or incomplete checkpoint: {problems[0]}"
                            f"{more}; run `trainer verify-checkpoint {checkpoint}`")
    engine = master_weights_of(model)  # the buffers engine loads into its masters
    if optimizer is None:
        state = {"model": model_state_target(model)}
    else:
        state = saved_state_dict(model, optimizer)
    with dcp_quiet():  # DCP's pickles read with DCP's classes only (metadata.py)
        dcp_load(state, checkpoint)
    trainer_state = json.loads((checkpoint / STATE_FILE).read_text())
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
    if optimizer is None:
        return trainer_state
    set_rng_state(json.loads((checkpoint / RNG_FILE).read_text()))
    return trainer_state
