"""One rank of a recipe at its real world size, built by ``trainer pretrain``'s own build, on
the meta device under a fake process group: what that rank holds, with no memory and no
hardware.

``build_rank(cfg, world_size, rank)`` settles the run as ``Trainer.__init__`` does
(``run_spec.settle``: every rule, as a UserError naming the fields), makes the ("pp", "dp",
"tp") mesh of ``build_mesh`` and calls ``build.build_run`` (the model, its pipeline stages,
the parallelism, the optimizer and the step runner) with ``tensors="meta"``: the model is
never materialized or initialized, so every parameter stays a meta tensor (DTensor of meta
locals under tp / FSDP2) and the build takes seconds even for 176B.

The byte counts are what *this trainer* keeps (``precision.py``, ``optim.py``,
``parallel/data_parallel.py``, ``parallel/distributed_optimizer.py``, ``parallel/pipeline.py``),
read from the local shard sizes of the built parameters and of the optimizer's parameters, not
a paper's ideal. Two engines keep them (``parallel/zero_engine.uses_buffers_engine``):

The buffers engine (``parallel/distributed_optimizer.py``, Megatron's distributed optimizer:
ZeRO-1/2 over dp > 1 in bf16 or fp32):

- parameters: in the dtype the model computes with (bf16: 2 bytes, fp32: 4), read off each
  local tensor; the model computes on them directly.
- gradients: the fp32 bucket buffers (``parallel/grad_buffers.py``): ZeRO-1 the whole
  ``[dp, S]`` buffers, 4 bytes per local element (and its padding); ZeRO-2 the persistent
  fp32 shards, 4/dp (a bucket's buffer exists only while that bucket's micro-batch gradients
  are reduced, not counted here).
- optimizer: Adam's m and v in fp32 on the owned rows (8 bytes per owned element) and the
  fp32 master copy of those rows when the model is not fp32 (4 bytes per owned element, read
  off the masters' storages, each counted once; in an fp32 run the master is a view of the
  parameter's rows and adds nothing): 2 + 4 + 12/dp bytes per parameter in bf16 at ZeRO-1.
- working: none (no second copy to compute with).

The FSDP2 engine (``parallel/data_parallel.py``: ZeRO-0 and ZeRO-3, fp16, or ``zero_engine =
"fsdp2"``), and any run on one process:

- parameters: fp32 whatever ``precision.dtype`` (autocast computes in bf16/fp16 from fp32
  master weights; there is no separate low-precision copy at rest): 4 bytes per local element.
- gradients: fp32 (autocast's cast backward returns fp32 ``.grad``), as held at the end of a
  step's backward: the dp-sharded size under ZeRO-2/3 without pipelining (reduce-scatter per
  micro-batch), the tp-local unsharded size otherwise (ZeRO-0/1 all-reduce whole gradients;
  under pp, ``PipelineStage`` accumulates ZeRO-2/3 gradients unsharded until the last
  micro-batch: pipeline.py's docstring).
- optimizer: AdamW / LAMB keep m and v in the parameter's dtype (fp32), 8 bytes per element of
  the tensors the optimizer steps: the ZeRO-1 ``ShardedOptimizer``'s dp slices, FSDP2's shards
  at ZeRO-2/3, the whole tp-local parameter at ZeRO-0.
- working: full (dp-unsharded, tp-local) fp32 parameters that exist only during forward and
  backward: FSDP2's ``replicate`` computes with a second plain copy (ZeRO-0/1), ZeRO-2 keeps
  every block gathered from its forward to its backward, ZeRO-3 gathers one block at a time
  (counted as the largest block), but under pp keeps the stage gathered through the step.
- With ``parallel.offload`` (ZeRO-3) parameters, gradients and optimizer state live in host
  memory: they are reported under ``host_bytes`` and not in ``device_bytes``.

Activations are not counted here (another model of the plan); ``RankPlan.model_state_bytes`` is
the device's model-state total to which an activation estimate is added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from bloomline.common.errors import UserError
from bloomline.trainer.build import BuiltRun
from bloomline.trainer.config import Config
from bloomline.trainer.plan.fake_world import fake_world

__all__ = ["RankPlan", "build_rank", "built_rank", "plan_rank", "planned_config",
           "planned_spec"]

FP32_BYTES = 4
ADAM_STATES = 2  # exp_avg and exp_avg_sq, in the parameter's dtype (fp32), for AdamW and LAMB


@dataclass(frozen=True)
class RankPlan:
    """What rank ``rank`` of a ``world_size`` run holds. ``stage_layers`` is the whole
    partition (block indices of every pipeline stage, in stage order); ``stages`` the stage ids
    this rank runs and ``layers`` their blocks. ``embedding_rows``: the rows of the embedding
    table (and tied head) this rank's tp shard covers, before any ZeRO-3 dp sharding; 0 when
    the rank holds no table. ``local_parameters``: elements of this rank's local parameter
    shards at rest (after tp and ZeRO-3 sharding; the last stage's tied copy of the embedding
    included). ``device_bytes`` by kind (parameters, gradients, optimizer, working; see the
    module docstring), ``host_bytes`` what offload keeps in host memory."""

    world_size: int
    rank: int
    pp: int
    dp: int
    tp: int
    coords: tuple[int, int, int]
    zero_stage: int
    vocab_size: int
    stage_layers: tuple[tuple[int, ...], ...]
    stages: tuple[int, ...]
    layers: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    has_final_norm: bool
    embedding_rows: int
    local_parameters: int
    device_bytes: dict[str, int] = field(default_factory=dict)
    host_bytes: int = 0

    @property
    def model_state_bytes(self) -> int:
        """Device bytes of parameters, gradients, optimizer state and working copies."""
        return sum(self.device_bytes.values())

    def describe(self) -> str:
        """A few lines for a person: layout, stage, layers, what it holds, bytes by kind."""
        gib = 2 ** 30
        span = f"{self.layers[0]}..{self.layers[-1]}" if self.layers else "none"
        held = [name for name, has in (("embedding", self.has_embedding),
                                       ("final norm", self.has_final_norm),
                                       ("head", self.has_head)) if has]
        lines = [f"rank {self.rank} of {self.world_size} (pp{self.pp} x dp{self.dp} x "
                 f"tp{self.tp}; pp, dp, tp = {self.coords}), ZeRO-{self.zero_stage}",
                 f"stages {list(self.stages)}: layers {span} ({len(self.layers)}), "
                 f"holds {', '.join(held) or 'blocks only'}",
                 f"local parameters {self.local_parameters:,}; embedding rows "
                 f"{self.embedding_rows:,} of {self.vocab_size:,}"]
        lines += [f"  {kind:<11}{value / gib:8.2f} GiB" for kind, value in
                  self.device_bytes.items()]
        lines.append(f"  {'total':<11}{self.model_state_bytes / gib:8.2f} GiB"
                     + (f" (+{self.host_bytes / gib:.2f} GiB in host memory)"
                        if self.host_bytes else ""))
        return "\n".join(lines)


def _local(tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _unsharded_numel(param) -> int:
    """Elements of ``param`` with the dp axis gathered but tp still split: what a rank holds
    when FSDP2 all-gathers it, and what an unsharded gradient of it takes."""
    if not hasattr(param, "placements"):
        return param.numel()
    from torch.distributed.tensor import Shard

    mesh, numel = param.device_mesh, param.numel()
    names = mesh.mesh_dim_names or ()
    for axis, placement in enumerate(param.placements):
        # _StridedShard is a Shard too; tp's divisibility is a layout rule checked already
        if isinstance(placement, Shard) and (axis >= len(names) or names[axis] != "dp"):
            numel //= mesh.size(axis)
    return numel


def _table_rows(weight) -> int:
    """Rows of the embedding table this rank's tp shard covers (dp sharding not counted)."""
    if not hasattr(weight, "placements"):
        return weight.shape[0]
    from torch.distributed.tensor import Shard

    mesh, rows = weight.device_mesh, weight.shape[0]
    names = mesh.mesh_dim_names or ()
    for axis, placement in enumerate(weight.placements):
        if isinstance(placement, Shard) and placement.dim == 0 and names[axis] == "tp":
            rows //= mesh.size(axis)
    return rows


def _check_vocabulary_given(cfg: Config) -> None:
    """model.vocab_size 0 is sized from the tokenizer as the trainer does, when the tokenizer
    is there; planning without it needs the size given."""
    from pathlib import Path

    if not cfg.model.vocab_size and (not cfg.data.tokenizer
                                     or not Path(cfg.data.tokenizer).exists()):
        raise UserError("model.vocab_size = 0 sizes the vocabulary from data.tokenizer, which "
                        "is not there: give the padded size (model.vocab_size=N)")


def planned_config(cfg: Config, target: str) -> Config:
    """A copy of ``cfg`` with what the planner changes for a run on ``target`` (``cuda`` or
    ``cpu``): ``model.attention`` ``auto`` resolved for it, and ``train.compile`` off
    (inductor cannot compile fake tensors; the memory of a compiled block is the same). The
    precision is settled for ``target`` by ``settle``."""
    from bloomline.trainer.model.attention import resolve_kernel
    from bloomline.trainer.run_spec import thawed_copy

    cfg = thawed_copy(cfg)
    cfg.model.attention = resolve_kernel(cfg.model.attention, torch.device(target))
    cfg.train.compile = False
    return cfg


def planned_spec(cfg: Config, world_size: int, rank: int, target: str = "cuda"):
    """The ``RunSpec`` of rank ``rank`` of a ``world_size`` run of ``cfg`` on ``target``, as
    ``trainer pretrain`` would settle it there (``planned_config``'s changes made)."""
    from bloomline.trainer.run_spec import settle

    if not 0 <= rank < world_size:
        raise UserError(f"rank {rank} is outside a world of {world_size} processes")
    _check_vocabulary_given(cfg)
    return settle(planned_config(cfg, target), world_size, rank, device=target,
                  check_tokenizer=False)


@contextlib.contextmanager
def _fake_tensors() -> Iterator[None]:
    """FakeTensorMode for a rank's build and step. Real tensors reach it from the device
    mesh, whose rank grid ``replicate`` reads, hence ``allow_non_fake_inputs``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True), _real_mesh_arithmetic():
        yield


@contextlib.contextmanager
def _real_mesh_arithmetic() -> Iterator[None]:
    """DeviceMeshes made under FakeTensorMode (FSDP2's ``replicate`` makes one) compute their
    rank grid with real tensors, as torch's own mesh slicing does: a fake grid has no
    values to find this rank's coordinates in."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    def init(self, *args, **kwargs):
        with unset_fake_temporarily():
            original(self, *args, **kwargs)

    DeviceMesh.__init__ = init
    try:
        yield
    finally:
        DeviceMesh.__init__ = original


@contextlib.contextmanager
def built_rank(cfg: Config, world_size: int, rank: int, fake: bool = False,
               target: str = "cuda") -> Iterator[BuiltRun]:
    """Build rank ``rank`` of a ``world_size``-process run of ``cfg`` (a loaded config,
    overrides applied) under ``fake_world`` and yield its ``build.BuiltRun``; the fake process
    group lives until the block ends. ``fake`` False: the parameters are meta tensors (no
    storage at all); True: everything is built under torch's ``FakeTensorMode``, whose tensors
    have sizes and devices but no data, so that a step can run on them (``traced_step``).
    Raises UserError for a layout the trainer would refuse (the same checks, the same
    messages, as ``trainer pretrain``)."""
    from bloomline.trainer.build import build_run
    from bloomline.trainer.parallel import build_mesh

    spec = planned_spec(cfg, world_size, rank, target)
    device = torch.device("cpu")  # the mesh's device type; the tensors stay meta or fake
    with fake_world(world_size, rank):
        mesh = build_mesh(spec.layout, device)  # of real tensors: DeviceMesh reads their values
        with _fake_tensors() if fake else contextlib.nullcontext():
            yield build_run(spec, mesh, device, tensors="fake" if fake else "meta")


def build_rank(cfg: Config, world_size: int, rank: int) -> RankPlan:
    """What rank ``rank`` of a ``world_size`` run of ``cfg`` holds, built on the meta device
    (``built_rank``); UserError for a layout the trainer would refuse."""
    with built_rank(cfg, world_size, rank) as built:
        return _measure(built)


def _buffers_engine_bytes(params: list, optimizer) -> dict[str, int]:
    """Device bytes of a rank on the buffers engine (see the module docstring): parameters
    in their dtype, the fp32 gradient buckets, Adam's moments on the owned rows and the fp32
    master rows that are not views of a parameter."""
    gradients = 0
    for bucket in optimizer.buffers.buckets:
        # ZeRO-1: the [dp, S] buffer (the shard is its row); ZeRO-2: the persistent shard
        held = bucket.shard if bucket.sharded_grads else bucket.buffer
        gradients += held.numel() * held.element_size()
    parameter_storages = {_local(p).untyped_storage()._cdata for p in params}
    masters: dict[int, int] = {}
    owned_bytes = 0  # of the fp32 owned rows: Adam keeps m and v of the same size
    for group in optimizer.inner.param_groups:
        for master in group["params"]:
            piece = _local(master)
            owned_bytes += piece.numel() * piece.element_size()
            storage = piece.untyped_storage()
            if storage._cdata not in parameter_storages:  # an fp32 run steps the rows in place
                masters[storage._cdata] = storage.nbytes()
    return {"parameters": sum(_local(p).numel() * _local(p).element_size() for p in params),
            "gradients": gradients, "optimizer": ADAM_STATES * owned_bytes + sum(masters.values()),
            "working": 0}


def _measure(built: BuiltRun) -> RankPlan:
    """The RankPlan of a built rank: shard sizes read off its parameters and optimizer (the
    buffers engine's: its buckets and master rows)."""
    cfg, layout, model, chunks = built.spec.config, built.spec.layout, built.model, built.chunks
    optimizer, zero, pp = built.optimizer, cfg.parallel.zero_stage, layout.pp
    params = list(model.parameters())
    local = sum(_local(p).numel() for p in params)
    if getattr(optimizer, "buffers", None) is not None:
        return _rank_plan(built, local, _buffers_engine_bytes(params, optimizer), 0)
    unsharded = sum(_unsharded_numel(p) for p in params)
    inner = getattr(optimizer, "inner", optimizer)  # ZeRO-1's ShardedOptimizer wraps one
    stepped = sum(_local(p).numel() for group in inner.param_groups for p in group["params"])
    sharded_grads = zero >= 2 and layout.dp > 1 and pp == 1
    grads = local if sharded_grads else unsharded
    if zero <= 2 or pp > 1 or layout.dp == 1:
        working = unsharded
    else:  # ZeRO-3 without pp: one block gathered at a time
        blocks = [b for chunk in chunks for b in chunk.h.values()]
        working = max((sum(_unsharded_numel(p) for p in b.parameters()) for b in blocks),
                      default=0)
    if layout.dp == 1 and zero == 0:
        working = 0  # no data parallelism applied: the model computes on its own parameters
    device_bytes = {"parameters": FP32_BYTES * local, "gradients": FP32_BYTES * grads,
                    "optimizer": ADAM_STATES * FP32_BYTES * stepped,
                    "working": FP32_BYTES * working}
    host = 0
    if cfg.parallel.offload:
        host = sum(device_bytes.pop(kind) for kind in ("parameters", "gradients", "optimizer"))
    return _rank_plan(built, local, device_bytes, host)


def _rank_plan(built: BuiltRun, local: int, device_bytes: dict[str, int],
               host: int) -> RankPlan:
    cfg, layout, model = built.spec.config, built.spec.layout, built.model
    stage_layers, stages = built.stage_layers, built.stages
    table = getattr(model, "word_embeddings", None)
    layers = tuple(i for s in stages for i in stage_layers[s])
    return RankPlan(
        world_size=layout.world_size, rank=layout.rank, pp=layout.pp, dp=layout.dp,
        tp=layout.tp, coords=layout.coords, zero_stage=cfg.parallel.zero_stage,
        vocab_size=cfg.model.vocab_size,
        stage_layers=tuple(tuple(r) for r in stage_layers), stages=stages, layers=layers,
        has_embedding=getattr(model, "word_embeddings_layernorm", None) is not None,
        has_head=table is not None and getattr(model, "ln_f", None) is not None,
        has_final_norm=getattr(model, "ln_f", None) is not None,
        embedding_rows=_table_rows(table.weight) if table is not None else 0,
        local_parameters=local, device_bytes=device_bytes, host_bytes=host)


def plan_rank(path, world_size: int, rank: int, overrides: list[str] | None = None) -> RankPlan:
    """``build_rank`` of the recipe at ``path`` loaded as ``trainer pretrain`` loads it
    (``load_trainer_config`` with ``overrides``)."""
    from bloomline.trainer.config import load_trainer_config

    return build_rank(load_trainer_config(path, overrides), world_size, rank)
