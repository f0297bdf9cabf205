"""Parallelism applied to the plain model from outside (the model code has none).

``parallelize(model, mesh, layout, cfg)`` applies, in this order (torchtitan's): tensor
parallelism (DTensor, ``tensor_parallel.py``), activation checkpointing
(``activation_checkpoint.py``), per-block compile, then data parallelism with the ZeRO stage
(DDP / FSDP2, ``data_parallel.py``; the buffers engine applies none: its optimizer,
``distributed_optimizer.py``, hooks the gradients). Pipeline parallelism splits the model
into stages first and parallelizes each stage the same way (``pipeline.py``). ``mesh.py``
owns the device mesh ("pp", "dp", "tp"); the layout's rules live with the config's
(``config_rules.py``). See README.md in this folder.
"""

from __future__ import annotations

from bloomline.trainer.parallel.mesh import (
    Layout,
    build_mesh,
    init_distributed,
    world_info,
)

__all__ = ["Layout", "build_mesh", "init_distributed", "parallelize", "world_info"]


def parallelize(model, mesh, layout: Layout, cfg):
    """Apply tp -> activation checkpointing -> compile -> dp/ZeRO to ``model`` (a GPT or a
    pipeline stage of one) in place; returns it."""
    # each transform imports its torch.distributed engine (DTensor, checkpoint wrappers, FSDP2)
    # only when the layout uses it
    if layout.tp > 1:
        from bloomline.trainer.parallel.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, mesh["tp"], cfg)
    if cfg.parallel.activation_checkpoint != "none":
        from bloomline.trainer.parallel.activation_checkpoint import (
            apply_activation_checkpointing,
        )

        apply_activation_checkpointing(model, cfg.parallel.activation_checkpoint)
    if cfg.train.compile:
        for block in _blocks(model):
            block.compile()
    from bloomline.trainer.parallel.zero_engine import uses_buffers_engine

    if uses_buffers_engine(cfg, layout.dp):
        return model  # its optimizer holds the gradient buffers (build.py)
    if layout.dp > 1 or cfg.parallel.zero_stage > 0:
        from bloomline.trainer.parallel.data_parallel import apply_data_parallel

        apply_data_parallel(model, mesh["dp"] if mesh is not None else None, cfg)
    return model


def _blocks(model):
    h = getattr(model, "h", None)
    return list(h.values()) if hasattr(h, "values") else list(h or [])
