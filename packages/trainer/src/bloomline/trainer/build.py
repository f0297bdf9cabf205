"""One rank's run built from its ``RunSpec``: the model (its pipeline stages under pp), the
parallelism, the optimizer, the precision policy and the step runner. ``Trainer``,
``trainer plan`` (rank build and traced step) and ``trainer evaluate`` all build here, so
what is planned and evaluated is what ``trainer pretrain`` runs.

``tensors`` chooses what the parameters are:

- ``real``: built on the meta device, materialized on ``device`` and initialized from
  ``train.seed``. Every rank builds and initializes the whole model from the same seed, then
  keeps its shards and stages: the weights equal the single-process run's, which the
  equivalence tests need.
- ``meta``: never materialized (DTensors of meta locals under tp / FSDP2): what a rank holds,
  in seconds even for 176B (``plan/rank_build.py``).
- ``fake``: created in the caller's ``FakeTensorMode`` (sizes and devices, no data), so that a
  step can run on them under a memory tracker (``plan/traced_step.py``).

The order of the transforms (tp -> activation checkpointing -> compile -> dp/ZeRO, per stage
under pp) is ``parallel.parallelize``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bloomline.common.errors import UserError
from bloomline.common.machine import format_bytes, memory_limit
from bloomline.trainer.config_rules import pipeline_microbatches
from bloomline.trainer.data.end_of_document import masks_documents, missing_eod
from bloomline.trainer.kernels.cpu.vector_math import warm_vector_math
from bloomline.trainer.model import GPT, ModelConfig, build_model
from bloomline.trainer.optim import build_optimizer
from bloomline.trainer.parallel import parallelize
from bloomline.trainer.parallel.zero_engine import uses_buffers_engine
from bloomline.trainer.precision import Precision
from bloomline.trainer.run_spec import RunSpec
from bloomline.trainer.step import PlainRunner, StepRunner
from bloomline.trainer.step.document_masks import DocumentMasks
from bloomline.trainer.step.sample_forward import loss_functions

__all__ = ["BuiltRun", "build_run", "check_model_fits"]

TENSORS = ("real", "meta", "fake")


@dataclass
class BuiltRun:
    """A built rank: ``model`` (the GPT, or the stages a pipeline rank keeps, under the
    single-process names), ``chunks`` (the modules it runs: the model, or one per local
    stage), ``stage_layers`` (the blocks of every pipeline stage, in stage order), ``stages``
    (this rank's stage ids), the ``optimizer`` (ZeRO-1's sharded one at dp > 1), the
    ``precision`` policy and the ``runner`` that steps them."""

    spec: RunSpec
    mesh: object
    model: torch.nn.Module
    chunks: list
    stage_layers: list
    stages: tuple[int, ...]
    optimizer: object
    precision: Precision
    runner: StepRunner


def check_model_fits(model: ModelConfig, device: torch.device) -> None:
    """Refuse, in one line and before allocating, a model whose whole fp32 initialization
    (every rank builds the whole model from the seed, then keeps its shards) cannot fit in
    ``device``'s memory at all: a config with a typo'd size would otherwise die in the
    allocator (a MemoryError traceback, or the kernel's out-of-memory kill)."""
    needed = model.num_parameters() * 4
    if device.type == "cuda":
        limit, where = torch.cuda.mem_get_info(device)[1], f"{device}'s memory"
    elif device.type == "cpu":
        limit, where = memory_limit(), "this machine's memory"
    else:
        return
    if limit is not None and needed > limit:
        raise UserError(
            f"model: {model.num_parameters():,} parameters (hidden_size {model.hidden_size}, "
            f"num_layers {model.num_layers}, vocab_size {model.vocab_size}) need "
            f"{format_bytes(needed)} to initialize in fp32, more than {where} "
            f"({format_bytes(limit)}); check the model's sizes")


def _document_masks(spec: RunSpec, tensors: str) -> DocumentMasks | None:
    """The run's document masking (None: off). Meta and fake builds (the planner) need no
    real EOD id: their tokens are random."""
    data = spec.config.data
    if not masks_documents(data):
        return None
    if spec.eod_id is None and tensors == "real":
        raise missing_eod(data)
    return DocumentMasks(spec.eod_id or 0, data.reset_attention_mask, data.eod_mask_loss)


def build_run(spec: RunSpec, mesh, device: torch.device, tensors: str = "real") -> BuiltRun:
    """Build this rank's run of ``spec`` on ``mesh`` (``parallel.build_mesh``; None for one
    process) with parameters on ``device`` (see the module docstring for ``tensors``)."""
    if tensors not in TENSORS:
        raise ValueError(f"tensors={tensors!r}: expected one of {TENSORS}")
    cfg, layout = spec.config, spec.layout
    if tensors == "real":
        warm_vector_math()  # before any computation: a resume repeats the run bit for bit
        check_model_fits(cfg.model, device)
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, device, seed=cfg.train.seed)
    elif tensors == "meta":
        with torch.device("meta"):
            model = GPT(cfg.model)
    else:
        model = GPT(cfg.model)
    precision = Precision(cfg.precision, device)
    loss_fn, loss_context = loss_functions(cfg.train.compile, layout.tp)
    dp_group = mesh["dp"].get_group() if layout.dp > 1 else None
    tp_mesh = mesh["tp"] if layout.tp > 1 else None
    stages_built = None
    if layout.pp > 1:  # this rank keeps its stages only, each parallelized
        from bloomline.trainer.parallel.pipeline import PipelineStages

        count = pipeline_microbatches(cfg, layout.dp)  # 0: it follows a ramped batch
        micro = (cfg.train.global_batch_size // layout.dp // count if count
                 else cfg.train.micro_batch_size)
        stages_built = PipelineStages(model, mesh, layout, cfg, device, precision, max(1, micro))
        model = stages_built.model  # the stages' modules, single-process names
        chunks, stage_layers = stages_built.chunks, stages_built.layers
        stage_ids = tuple(stages_built.stage_ids)
    else:
        parallelize(model, mesh, layout, cfg)
        chunks, stage_layers, stage_ids = [model], [range(cfg.model.num_layers)], (0,)
    optimizer = build_optimizer(model, cfg.optimizer)
    if uses_buffers_engine(cfg, layout.dp):
        from bloomline.trainer.parallel.distributed_optimizer import DistributedOptimizer

        optimizer = DistributedOptimizer(optimizer, model, chunks, mesh,
                                         cfg.parallel.bucket_size,
                                         sharded_grads=cfg.parallel.zero_stage == 2,
                                         device=device, compute_dtype=precision.dtype)
    elif layout.dp > 1 and cfg.parallel.zero_stage == 1:
        from bloomline.trainer.parallel.data_parallel import shard_optimizer_state

        optimizer = shard_optimizer_state(optimizer, mesh["dp"])
    clip, mbs = cfg.optimizer.clip_grad, cfg.train.micro_batch_size
    if stages_built is not None:
        from bloomline.trainer.step.pipelined import PipelinedRunner

        runner = PipelinedRunner(stages_built, optimizer, precision, tp_mesh, loss_fn,
                                 loss_context, dp_group, clip, mbs)
    else:
        runner = PlainRunner(model, optimizer, precision, device, tp_mesh, loss_fn,
                             loss_context, dp_group, clip, mbs)
    runner.documents = _document_masks(spec, tensors)
    return BuiltRun(spec, mesh, model, chunks, list(stage_layers), stage_ids, optimizer,
                    precision, runner)
