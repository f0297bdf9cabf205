"""Data parallelism and ZeRO stages 0-3 on FSDP2's engine, applied from outside the model.

ZeRO-1/2 in bf16 and fp32 runs default to the buffers engine instead
(``distributed_optimizer.py``: bf16 parameters, fp32 gradient buckets, a sharded fp32
master); this engine serves ZeRO-0 and 3, offload, fp16, and ``parallel.zero_engine =
"fsdp2"``.

``apply_data_parallel(model, dp_mesh, cfg)`` wraps a GPT (or a pipeline stage of one) per block,
then at the root, with PyTorch's composable APIs, so parameter names (and the state-dict keys
DCP checkpoints use) stay the single-process ones: no ``module.`` prefix as with DDP.
``shard_optimizer_state(optimizer, dp_mesh)`` adds ZeRO-1's sharded optimizer.

What each rank keeps where (Ψ parameters, dp ranks; fp32 parameters and gradients, Adam's m
and v; "at rest" is between steps, when the trainer has freed the gradients):

- Stage 0 (DDP): ``replicate`` (torch's DDP on FSDP2's machinery). Parameters are Replicate
  DTensors: the whole model on every rank (4Ψ). In forward/backward FSDP2 computes with a
  second, plain copy of each block's parameters (another 4Ψ, freed after backward: the price
  of the engine; DDP proper computes on the parameter itself). Gradients are summed locally
  over the micro-batches and all-reduced (averaged) once, after the last one (4Ψ). The
  optimizer is plain and holds m and v for every parameter (8Ψ).
- Stage 1: stage 0's model, plus ``shard_optimizer_state``: each rank steps only its dim-0
  slice of every parameter (``Shard(0)`` over dp, ``torch.chunk``'s split) and keeps m and v
  for that slice only (8Ψ/dp), then all-gathers the updated slices. Gradients are still
  all-reduced whole (4Ψ).
- Stage 2: ``fully_shard(reshard_after_forward=False)``. FSDP2 keeps a dim-0 shard of each
  parameter as the parameter the optimizer sees (4Ψ/dp at rest); forward all-gathers each
  block's full parameters and keeps them until that block's backward (so from forward to
  backward the whole model is held, 4Ψ, as ZeRO-2's replicated parameters), and frees them
  after backward ("reshard after backward", FSDP2's default). Gradients are reduce-scattered:
  each rank keeps the sum for its shard only (4Ψ/dp); optimizer state follows the shard
  (8Ψ/dp).
- Stage 3: ``fully_shard(reshard_after_forward=True)`` per block, then the root (embedding,
  final LayerNorm): full parameters exist only for the block being computed (all-gathered
  again in backward). Parameters, gradients and optimizer state 4Ψ/dp + 4Ψ/dp + 8Ψ/dp.
- Offload (stage 3 only): FSDP2's ``CPUOffloadPolicy``: the parameter shards, their gradients
  (copied to the host in backward) and the optimizer state live in host memory and the
  optimizer steps there; the device holds only the block being computed.

Gradient accumulation. Stages 0-1 reduce once per step: ``set_requires_gradient_sync(False)``
(FSDP2's, on the root) for all but the last micro-batch, and each rank accumulates its whole
gradient locally in between, which it holds anyway. Stages 2-3 reduce-scatter after every
micro-batch (``set_gradient_sync`` leaves their sync on)
and accumulate into the sharded gradient: FSDP2's no-sync mode would accumulate the *unsharded*
gradient (4Ψ per rank until the last micro-batch), undoing ZeRO-2/3's gradient sharding for
the whole accumulation; ZeRO (DeepSpeed) reduces per micro-batch for the same reason.

Precision (every stage). Our policy is autocast with fp32 parameters (precision.py): the
weights FSDP2 all-gathers and computes with are fp32 (``MixedPrecisionPolicy.param_dtype``
None; autocast casts per matmul), so each ``.grad`` is fp32. The policy sets ``reduce_dtype``
fp32 anyway, so the reduction stays fp32 whatever a future ``param_dtype``. Accumulation across
micro-batches: stages 0-1 in FSDP2's unsharded fp32 gradient, stages 2-3 in the fp32 sharded
``.grad`` (FSDP2 adds each reduce-scattered fp32 shard to it); ZeRO-1's optimizer reads the
fp32 all-reduced gradient.

Tensor parallelism: parameters that are already tp DTensors are sharded by FSDP2 over the
(dp, tp) mesh (``fully_shard(mesh=dp_mesh)`` on the tp-parallelized modules; dp and tp come
from the same root mesh). ZeRO-1 shards each tp-local slice over dp in the same way
(``_StridedShard`` where tp already splits dim 0, as FSDP2 does).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from bloomline.common.errors import UserError
from bloomline.trainer.parallel.sharded_optimizer_state import (
    ModelParameterView,
    dp_rows_placement,
)

__all__ = ["ShardedOptimizer", "apply_data_parallel", "set_gradient_sync",
           "shard_optimizer_state"]

# the models ``apply_data_parallel`` sharded with ZeRO-2/3: they reduce-scatter after every
# micro-batch, so that their gradients stay sharded (module docstring)
_REDUCED_EVERY_MICRO_BATCH: weakref.WeakSet = weakref.WeakSet()


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Whether the next backward reduces gradients over dp (off for all but the last
    micro-batch of a step). A no-op for a model without data parallelism, and for ZeRO-2/3,
    which reduce-scatter after every micro-batch to keep gradients sharded. On the buffers
    engine it tells the buckets to reduce as they complete (the last micro-batch)."""
    from bloomline.trainer.parallel.grad_buffers import set_sync

    if set_sync(model, enabled):  # the buffers engine (distributed_optimizer.py)
        return
    setter = getattr(model, "set_requires_gradient_sync", None)  # FSDP2's (replicate, shard)
    if setter is not None and model not in _REDUCED_EVERY_MICRO_BATCH:
        setter(enabled)


def _blocks(model: nn.Module) -> list[nn.Module]:
    h = getattr(model, "h", None)
    return list(h.values()) if hasattr(h, "values") else list(h or [])


def apply_data_parallel(model: nn.Module, dp_mesh, cfg) -> nn.Module:
    """Apply ``cfg.parallel.zero_stage`` (and ``offload``) over ``dp_mesh`` to ``model`` in
    place, per block then at the root; returns it. ``dp_mesh`` None (one process): nothing to
    shard, and offload is refused (FSDP2 needs a process group). The model keeps its methods
    (``set_activation_stats``...) and gains FSDP2's (``set_requires_gradient_sync``...)."""
    if dp_mesh is None:
        if cfg.parallel.offload:
            raise UserError("parallel.offload needs torch.distributed: run with 2 or more "
                            "processes (trainer pretrain --nproc N, or torchrun)")
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    stage, offload = cfg.parallel.zero_stage, cfg.parallel.offload
    # fp32 parameters (autocast casts per op), fp32 reduction: see the module docstring
    precision = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    if stage <= 1:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in _blocks(model):  # one all-reduce per block, overlapping backward
            replicate(block, mesh=dp_mesh, mp_policy=precision)
        replicate(model, mesh=dp_mesh, mp_policy=precision)
        return model
    from torch.distributed.fsdp import fully_shard

    policy = OffloadPolicy()
    if offload:
        # pinned host memory speeds host<->GPU copies; there is no such copy on a CPU run
        policy = CPUOffloadPolicy(pin_memory=dp_mesh.device_type == "cuda")
    reshard = stage == 3
    for block in _blocks(model):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=precision,
                    offload_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=precision,
                offload_policy=policy)
    _REDUCED_EVERY_MICRO_BATCH.add(model)
    return model


# -- ZeRO-1 -----------------------------------------------------------------------------------


class _Slice:
    """One parameter's ZeRO-1 shard: rows [offset, offset + size) of dim 0 of its local tensor
    (the tp shard, or the whole tensor), split over dp like ``torch.chunk``, described as a
    DTensor over the parameter's mesh with the dp axis sharded."""

    def __init__(self, param: torch.Tensor, dp_mesh) -> None:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        if not isinstance(param, DTensor):
            raise TypeError("shard_optimizer_state expects the DTensor parameters of a model "
                            "wrapped by apply_data_parallel with zero_stage 1")
        mesh, placements = param.device_mesh, list(param.placements)
        names = mesh.mesh_dim_names or ()
        dp_name = (dp_mesh.mesh_dim_names or (None,))[0]
        axis = names.index(dp_name) if dp_name in names else 0
        if not isinstance(placements[axis], Replicate):
            raise ValueError(f"parameter placements {placements}: expected Replicate on dp")
        self.param = param
        local = param.to_local()
        if local.ndim == 0:  # a scalar stays whole on every rank
            self.offset, self.size = None, None
        else:
            self.size, self.offset = Shard.local_shard_size_and_offset(
                local.shape[0], dp_mesh.size(), dp_mesh.get_local_rank())
            # other axes (tp) that already split dim 0: dp splits each of their pieces, the
            # layout FSDP2 gives tp+dp parameters
            split = 1
            for other, placement in enumerate(placements):
                if other != axis and isinstance(placement, Shard) and placement.dim == 0:
                    split *= mesh.size(other)
            placements[axis] = dp_rows_placement(split)
        self.mesh, self.placements = mesh, tuple(placements)
        self.shard = nn.Parameter(self.as_shard(local), requires_grad=param.requires_grad)

    def as_shard(self, whole: torch.Tensor):
        """This rank's slice of ``whole`` (a local tensor laid out as the parameter's), as a
        DTensor view: writing into it writes into ``whole``."""
        from torch.distributed.tensor import DTensor

        local = whole if self.offset is None else whole.narrow(0, self.offset, self.size)
        return DTensor.from_local(local, self.mesh, self.placements, shape=self.param.shape,
                                  stride=self.param.stride())


class ShardedOptimizer(ModelParameterView):
    """ZeRO-1: ``optimizer`` steps only this rank's dp shard of each (replicated) parameter and
    keeps its state (Adam's m, v) for that shard; the updated shards are then all-gathered.

    Why our own: ``ZeroRedundancyOptimizer`` assigns whole parameters to ranks and gives DCP no
    sharded state (its ``state_dict`` consolidates onto one rank); FSDP2 cannot keep whole
    gradients with a sharded state. Here the inner optimizer runs on DTensor views of the
    parameters' local slices (no copy of the weights: stepping a view updates the parameter),
    so its state is made of dp-sharded DTensors, and ``state_dict`` / ``load_state_dict`` hand
    DCP sharded, reshardable tensors that ``get_state_dict`` files under the model's parameter
    names. The all-gather is DTensor's redistribute, one per parameter (unbucketed).

    ``param_groups`` hold the model's parameters (the trainer sets ``lr`` on them, DCP maps them
    to names); their hyper-parameters are copied into the inner groups before each step. The
    views stay valid because FSDP2 keeps each parameter's storage (DCP and ``set_state_dict``
    load in place); a parameter replaced afterwards (``load_state_dict(assign=True)``) needs a
    new ``ShardedOptimizer``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, dp_mesh) -> None:
        self.dp_mesh = dp_mesh
        self._slices: list[_Slice] = []
        groups = []
        for group in optimizer.param_groups:
            slices = [_Slice(param, dp_mesh) for param in group["params"]]
            self._slices.extend(slices)
            groups.append({**group, "params": [s.param for s in slices]})
            group["params"] = [s.shard for s in slices]
        super().__init__(optimizer, groups, {s.param: s.shard for s in self._slices})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._push_hyperparameters()
        for s in self._slices:
            grad = s.param.grad  # all-reduced: whole on every rank; step this rank's slice
            s.shard.grad = None if grad is None else s.as_shard(grad.to_local())
        self.inner.step()
        for s in self._slices:
            if s.shard.grad is not None:
                whole = s.shard.redistribute(s.mesh, s.param.placements).to_local()
                s.param.to_local().copy_(whole)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for s in self._slices:
            s.shard.grad = None
            if s.param.grad is not None:
                if set_to_none:
                    s.param.grad = None
                else:
                    s.param.grad.zero_()

    def __repr__(self) -> str:
        return f"ShardedOptimizer(dp={self.dp_mesh.size()}, {self.inner!r})"


def shard_optimizer_state(optimizer: torch.optim.Optimizer, dp_mesh) -> ShardedOptimizer:
    """ZeRO-1: the state of ``optimizer`` (built over a stage-1 model's parameters) sharded
    over ``dp_mesh``; see ``ShardedOptimizer``."""
    return ShardedOptimizer(optimizer, dp_mesh)
