"""Activation checkpointing (``parallel.activation_checkpoint``), applied from outside the model.

- ``full``: every block keeps only its input in forward and recomputes itself in backward
  (Megatron's ``--recompute-granularity full --recompute-method uniform`` with one layer per
  group): activation memory per block drops from ~``34 b L h + 5 b heads L^2`` bytes to the
  ``b L h`` input, for one extra forward.
- ``selective``: only the attention core of the ``eager`` kernel is recomputed (scores,
  softmax, dropout, the product with V: Megatron's ``--recompute-activations``): the
  ``heads x L x L`` tensors that dominate at long sequences, recomputed for few FLOPs. The
  ``sdpa`` and ``flex`` kernels keep no ``L x L`` tensors for backward (their fused kernels
  recompute the scores themselves), so they have nothing to recompute and stay as they are.

Both use ``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG state preserved so dropout
masks replay) installed as an instance-level override of the checkpointed function. The modules
stay where they are: parameter names and state-dict keys do not change (``checkpoint_wrapper``
would insert ``_checkpoint_wrapped_module.``), and the hooks tensor and data parallelism put on
a block still run around the checkpointed forward, as they do around torchtitan's wrapper.
"""

from __future__ import annotations

import functools

from torch.utils.checkpoint import checkpoint

__all__ = ["apply_activation_checkpointing"]

_MARK = "_bloomline_checkpointed"


def _checkpointed(fn):
    return functools.partial(checkpoint, fn, use_reentrant=False, preserve_rng_state=True)


def _override(module, name: str) -> None:
    """``module.name`` (a bound method) replaced, on this instance only, by its checkpointed
    call; applying twice is a no-op."""
    marked = getattr(module, _MARK, set())
    if name in marked:
        return
    setattr(module, name, _checkpointed(getattr(module, name)))
    setattr(module, _MARK, marked | {name})


def apply_activation_checkpointing(model, mode: str):
    """Checkpoint ``model``'s blocks (``full``) or their attention cores (``selective``) in
    place; ``model`` is a GPT or a pipeline stage of one. Returns it."""
    if mode == "none":
        return model
    if mode not in ("full", "selective"):
        raise ValueError(f"parallel.activation_checkpoint {mode!r}: expected none, full or "
                         "selective")
    for block in model.h.values():
        if mode == "full":
            _override(block, "forward")
        else:
            _override(block.self_attention, "_eager")
    return model
