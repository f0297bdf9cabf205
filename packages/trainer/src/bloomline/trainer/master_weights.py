"""Where a model's weights are kept in full precision, when not in the model itself.

On the buffers engine (``parallel/distributed_optimizer.py``) the model computes with bf16
parameters and the fp32 weights are the optimizer's master rows. Whoever reads or writes a
model's weights as a whole (the checkpoint's save and load, ``checkpoint.init_from``) asks
``master_weights_of(model)`` first. A leaf module (it imports nothing of the trainer), so
``checkpoint/`` and ``parallel/`` both use it without importing each other.

A holder provides:

- ``master_state(names)``: {name: fp32 tensor} (live DTensors, sharded as the holder keeps
  them) for ``names`` (parameter -> name): what a checkpoint saves and loads in place;
- ``publish()``: copy the masters into the model's parameters (after they were loaded);
- ``load_full(full, names)``: set the weights from whole tensors every rank has.
"""

from __future__ import annotations

import weakref

__all__ = ["master_weights_of", "register_master_weights"]

_HOLDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_master_weights(model, holder) -> None:
    """``holder`` keeps ``model``'s full-precision weights from now on."""
    _HOLDERS[model] = holder


def master_weights_of(model):
    """The holder of ``model``'s full-precision weights, or None: the model's own."""
    return _HOLDERS.get(model)
