"""One rank of a recipe at its real world size, built the way ``trainer pretrain`` builds it,
on the meta device under a fake process group: what that rank holds, with no memory and no
hardware.

``build_rank(cfg, world_size, rank)`` follows ``Trainer.__init__`` (loop.py) step by step:
``resolve_layout`` (every divisibility rule, as a UserError naming the fields), the
("pp", "dp", "tp") mesh of ``build_mesh``, the GPT (built on the meta device, as ``build_model``
does before it materializes), then ``build_pipeline`` (pp > 1: the stage split of
``partition.py``, pruning, and ``parallelize`` per stage) or ``parallelize`` (tp -> activation
checkpointing -> compile -> dp/ZeRO), then ``build_optimizer`` and, for ZeRO-1,
``shard_optimizer_state``. The one departure: the model is never materialized or initialized
(``to_empty`` + ``init_weights``), so every parameter stays a meta tensor (DTensor of meta
locals under tp / FSDP2) and the build takes seconds even for 176B.

The byte counts are what *this trainer* keeps (``precision.py``, ``optim.py``,
``parallel/data_parallel.py``, ``parallel/pipeline.py``), read from the local shard sizes of
the built parameters and of the optimizer's parameters, not a paper's ideal:

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
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from bloomline.common.errors import UserError
from bloomline.trainer.config import Config
from bloomline.trainer.plan.fake_world import fake_world

__all__ = ["BuiltRank", "RankPlan", "build_rank", "built_rank", "plan_rank", "planned_config"]

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


def _resolve_vocab(cfg: Config) -> None:
    """model.vocab_size 0 (from the tokenizer) resolved as the trainer does, when the
    tokenizer is there; planning without it needs the size given."""
    if cfg.model.vocab_size:
        return
    from pathlib import Path

    if not cfg.data.tokenizer or not Path(cfg.data.tokenizer).exists():
        raise UserError("model.vocab_size = 0 sizes the vocabulary from data.tokenizer, which "
                        "is not there: give the padded size (model.vocab_size=N)")
    from bloomline.trainer.loop import resolve_vocab

    resolve_vocab(cfg)


@dataclass
class BuiltRank:
    """A rank as ``built_rank`` leaves it, inside its fake world: the layout, the mesh, the
    model (a pipeline rank's pruned stages), the modules the rank runs (``chunks``: the model,
    or one per local pipeline stage), the optimizer, the stage partition and, under pp, the
    ``Pipeline``."""

    cfg: Config
    layout: object
    mesh: object
    model: torch.nn.Module
    chunks: list
    optimizer: object
    stage_layers: list
    stages: tuple[int, ...]
    pipeline: object = None


def planned_config(cfg: Config, target: str) -> Config:
    """A copy of ``cfg`` with what depends on the device resolved for a run on ``target``
    (``cuda`` or ``cpu``): ``precision.dtype`` ``auto`` (bf16 on a GPU), ``model.attention``
    ``auto``; and ``train.compile`` off (inductor cannot compile fake tensors; the memory of
    a compiled block is the same)."""
    from bloomline.trainer.model.attention import resolve_kernel
    from bloomline.trainer.precision import resolve_dtype

    cfg = copy.deepcopy(cfg)
    device = torch.device(target)
    if target == "cuda":
        if cfg.precision.dtype == "auto":
            cfg.precision.dtype = "bf16"  # every GPU the planner knows computes bf16 natively
    else:
        resolve_dtype(cfg.precision, device)
    cfg.model.attention = resolve_kernel(cfg.model.attention, device)
    cfg.train.compile = False  # inductor cannot compile fake tensors; the memory is the same
    return cfg


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
               target: str = "cuda") -> Iterator[BuiltRank]:
    """Build rank ``rank`` of a ``world_size``-process run of ``cfg`` (loaded with
    ``load_trainer_config``, overrides applied) under ``fake_world`` and yield it; the fake
    process group lives until the block ends. ``fake`` False: the GPT is built on the meta
    device (no storage at all); True: everything is built under torch's ``FakeTensorMode``,
    whose tensors have sizes and devices but no data, so that a step can run on them
    (``traced_step``). Raises UserError for a layout the trainer would refuse (the same checks,
    the same messages, as ``trainer pretrain``). ``cfg`` may be completed in place (a
    vocabulary of 0 resolved from the tokenizer), as the trainer does; the rank is built
    from a copy with the device-dependent settings resolved for ``target``
    (``planned_config``), which ``BuiltRank.cfg`` holds."""
    from bloomline.trainer.config import validate
    from bloomline.trainer.forward_backward import loss_functions
    from bloomline.trainer.model import GPT
    from bloomline.trainer.optim import build_optimizer
    from bloomline.trainer.parallel import build_mesh, parallelize, resolve_layout
    from bloomline.trainer.parallel.data_parallel import shard_optimizer_state
    from bloomline.trainer.parallel.partition import uniform_split
    from bloomline.trainer.parallel.pipeline import build_pipeline

    if not 0 <= rank < world_size:
        raise UserError(f"rank {rank} is outside a world of {world_size} processes")
    layout = resolve_layout(cfg, world_size, rank)  # every layout rule, before any group
    validate(cfg, layout.dp)
    _resolve_vocab(cfg)
    cfg = planned_config(cfg, target)
    layout = resolve_layout(cfg, world_size, rank)  # again: the vocabulary is known
    device = torch.device("cpu")  # the mesh's device type; the tensors stay meta or fake
    if fake:
        tensors, model_tensors = _fake_tensors(), contextlib.nullcontext()
    else:
        tensors, model_tensors = contextlib.nullcontext(), torch.device("meta")
    with fake_world(world_size, rank):
        mesh = build_mesh(layout, device)  # of real tensors: DeviceMesh reads their values
        with tensors:
            with model_tensors:
                model = GPT(cfg.model)
            pipeline = None
            if layout.pp > 1:
                loss_fn, loss_context = loss_functions(cfg.train.compile, layout.tp)
                pipeline = build_pipeline(model, mesh, layout, cfg, device, loss_fn,
                                          loss_context)
                model = pipeline.model
                stage_layers = pipeline.layers
                stages = tuple(pipeline.stage_ids)
                chunks = pipeline.chunks
            else:
                stage_layers = uniform_split(cfg.model.num_layers, 1)
                stages = (0,)
                parallelize(model, mesh, layout, cfg)
                chunks = [model]
            optimizer = build_optimizer(model, cfg.optimizer)
            if layout.dp > 1 and cfg.parallel.zero_stage == 1:
                optimizer = shard_optimizer_state(optimizer, mesh["dp"])
            yield BuiltRank(cfg, layout, mesh, model, chunks, optimizer, stage_layers, stages,
                            pipeline)


def build_rank(cfg: Config, world_size: int, rank: int) -> RankPlan:
    """What rank ``rank`` of a ``world_size`` run of ``cfg`` holds, built on the meta device
    (``built_rank``); UserError for a layout the trainer would refuse."""
    with built_rank(cfg, world_size, rank) as built:
        return _measure(built)


def _measure(built: BuiltRank) -> RankPlan:
    """The RankPlan of a built rank: shard sizes read off its parameters and optimizer."""
    cfg, layout, model, chunks = built.cfg, built.layout, built.model, built.chunks
    optimizer, stage_layers, stages = built.optimizer, built.stage_layers, built.stages
    zero, pp = cfg.parallel.zero_stage, layout.pp
    params = list(model.parameters())
    local = sum(_local(p).numel() for p in params)
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
    table = getattr(model, "word_embeddings", None)
    layers = tuple(i for s in stages for i in stage_layers[s])
    return RankPlan(
        world_size=layout.world_size, rank=layout.rank, pp=layout.pp, dp=layout.dp,
        tp=layout.tp, coords=layout.coords, zero_stage=zero, vocab_size=cfg.model.vocab_size,
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
