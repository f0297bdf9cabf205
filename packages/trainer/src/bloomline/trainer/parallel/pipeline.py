"""Pipeline parallelism on ``torch.distributed.pipelining``.

Mental model:

- Every rank builds and initializes the whole GPT (same seed, same values), then keeps only the
  modules of its stages by deleting the rest. ``GPT.h`` is a ModuleDict keyed "0".."N-1", so
  the kept blocks keep their names: the stage's state dict is a subset of the single-process
  one, under the same keys, and DCP checkpoints save and reshard without renaming.
- Stages: ``pipeline_parallel`` x ``virtual_stages`` (interleaved) or ``pipeline_parallel``
  contiguous runs of blocks (``partition.py``), stage ``s`` on pp rank ``s % pp`` (looping
  assignment, Megatron's and torch's). The first stage embeds, the last applies ``ln_f`` and
  the head; each stage is a pruned GPT wrapped in a ``PipelineStage`` and run by
  ``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``.
- Each stage is parallelized like a whole model (``parallelize``: tp -> activation
  checkpointing -> compile -> dp/ZeRO); ``Pipeline.model`` is the rank's GPT holding all its
  stages' modules (what the optimizer, the checkpoint and ``full_model_state`` see).
- The loss runs on the last stage in fp32 (``lm_loss``), divided by the micro-batch count
  (``scale_grads=False``): the gradients are those of the mean of the micro-batch means, as in
  the single-process loop. The loss is averaged over dp and broadcast from the last stage, so
  every rank logs it and takes the same NaN-skip decision. Per-sample losses (evaluation, the
  per-source train loss at log steps) also come from the last stage's loss: summed per
  dataset over dp there, then broadcast over pp like the loss.
- Tied embedding: see ``_TiedEmbedding``. Gradient-norm clipping: see ``clip_grad_norm``.
- Data parallelism inside a stage (ZeRO 0-3, data_parallel.py): the schedule, not the loop,
  runs backward, and ``PipelineStage`` drives FSDP2 (``replicate`` for ZeRO-0/1,
  ``fully_shard`` for 2/3) itself: it turns gradient sync and resharding off for every
  micro-batch's backward and reduces once after the last (``perform_reduce_grad``). So under
  pipelining ZeRO-2/3 accumulate *unsharded* gradients during the step and ZeRO-3 keeps a
  stage's parameters gathered from their first backward to the end of the step (the memory
  of ZeRO-1 during the step, sharded again between steps); results are the same. ZeRO-1
  (our ``ShardedOptimizer``) is unaffected. ZeRO-1, 2 and 3 are tested with pp (ZeRO-0 is
  ZeRO-1's ``replicate`` with a plain optimizer).
- fp16: the loss scale is shared (every rank unscales; an inf/NaN on any stage makes every
  rank skip), see ``_unscale``.
- Each new micro-batch count or shape (batch-size ramp-up, sequence-length warmup, an
  evaluation remainder) builds its own stages and schedule (torch's stages size their
  buffers from the first micro-batch, by one extra forward/backward of shape inference).
  Ramp-up steps with fewer micro-batches than 1F1B takes run the GPipe order.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from bloomline.common.errors import UserError
from bloomline.trainer.losses import per_sample_means, token_cross_entropy
from bloomline.trainer.parallel import parallelize
from bloomline.trainer.parallel.partition import partition_layers
from bloomline.trainer.precision import Precision
from bloomline.trainer.reporting.metrics import activation_stats
from bloomline.trainer.step import (
    dp_mean,
    finish_step,
    max_norm,
    set_learning_rate,
    step_source_totals,
)

__all__ = ["Pipeline", "build_pipeline", "num_pipeline_stages", "stage_view"]


def num_pipeline_stages(cfg) -> int:
    p = cfg.parallel
    return p.pipeline_parallel * (p.virtual_stages if p.pipeline_schedule == "interleaved"
                                  else 1)


def _prune(model, blocks: set[int], first: bool, last: bool):
    """Delete, in place, every module of ``model`` (a whole GPT) that stages with ``blocks``
    (and the embedding when ``first``, the head when ``last``) do not use."""
    for name in list(model.h.keys()):
        if int(name) not in blocks:
            del model.h[name]
    if not first:
        model.word_embeddings_layernorm = None
        model.embeds_tokens = False
        if not last:
            model.word_embeddings = None
    if not last:
        model.ln_f = None
    return model


def stage_view(model, blocks: range, first: bool, last: bool):
    """A GPT over the modules of one stage of ``model`` (a pruned GPT holding them): the same
    module objects (no copy), so parameters are shared and keep their names. Used when a rank
    holds several stages (interleaved), each needing a module of its own to run."""
    view = type(model).__new__(type(model))
    nn.Module.__init__(view)
    for key, value in vars(model).items():  # plain attributes: config, flags
        if not key.startswith("_") and key != "training":
            setattr(view, key, value)
    view.word_embeddings = model.word_embeddings if first or last else None
    view.word_embeddings_layernorm = model.word_embeddings_layernorm if first else None
    view.embeds_tokens = first
    view.h = nn.ModuleDict({str(i): model.h[str(i)] for i in blocks})
    view.ln_f = model.ln_f if last else None
    return view


class _TiedEmbedding:
    """The embedding/head weight tie across the first and the last stage, as Megatron keeps it:
    the last stage holds its own copy of ``word_embeddings.weight`` (initialized from the same
    values: every rank builds the whole model from one seed), used only by the head. After
    backward the two copies' gradients are summed (all-reduce over the group {first stage,
    last stage} of the same dp/tp coordinates), so both hold the gradient of the tied weight
    (embedding + head contributions, what one process computes) and, with the same optimizer
    state, both copies stay identical step after step. The gradient norm counts the weight
    once (on the first stage), the checkpoint and ``full_model_state`` hold it once under
    ``word_embeddings.weight``."""

    def __init__(self, model, layout, holds_first: bool, holds_last: bool) -> None:
        pp, dp, tp = layout.pp, layout.dp, layout.tp
        pairs = [[d * tp + t, (pp - 1) * dp * tp + d * tp + t]
                 for d in range(dp) for t in range(tp)]
        # every rank takes part in creating every group; the middle stages join none
        self.group, _ = dist.new_subgroups_by_enumeration(pairs)
        self.model = model
        self.holds = holds_first or holds_last
        self.is_copy = holds_last and not holds_first

    @property
    def weight(self):
        """This rank's copy (read each time: parallelism replaces parameters by DTensors)."""
        return self.model.word_embeddings.weight if self.holds else None

    def all_reduce_grad(self) -> None:
        if self.weight is None or self.weight.grad is None:
            return
        weight, grad = self.weight, self.weight.grad
        if hasattr(grad, "placements") and grad.placements != weight.placements:
            # tp: the embedding's backward gives a Replicate gradient of the Shard(0) table,
            # the head's a Shard(0) one; lay both out as the weight is
            grad = weight.grad = grad.redistribute(weight.device_mesh, weight.placements)
        # a DTensor gradient (tp: vocabulary shards, FSDP: dp shards) is reduced shard by
        # shard: both stages shard the weight the same way, so local shards correspond
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.group)


class Pipeline:
    """This rank's pipeline stages, the schedule that runs them, and the pp-aware pieces of
    the step (tied gradients, clipping, loss broadcast, full state)."""

    def __init__(self, model, mesh, layout, cfg, device: torch.device, loss_fn,
                 loss_context=None) -> None:

        self.cfg, self.layout, self.mesh, self.device = cfg, layout, mesh, device
        self.loss_fn = loss_fn
        self.loss_context = loss_context
        precision = Precision(cfg.precision, device)  # for its autocast and dtype only
        self.autocast = precision.autocast
        pp, rank = layout.pp, layout.pp_rank
        self.schedule_name = cfg.parallel.pipeline_schedule
        self.num_stages = num_pipeline_stages(cfg)
        self.pp_group = mesh["pp"].get_group()
        self.dp_group = mesh["dp"].get_group() if layout.dp > 1 else None
        self.stage_ids = list(range(rank, self.num_stages, pp))
        static_micro = self._static_microbatches()
        micro_size = (cfg.train.global_batch_size // layout.dp // static_micro
                      if static_micro else cfg.train.micro_batch_size)
        self.layers = partition_layers(model, cfg, self.num_stages, max(1, micro_size),
                                       precision.dtype)
        holds_first, holds_last = 0 in self.stage_ids, self.num_stages - 1 in self.stage_ids
        mine = {i for s in self.stage_ids for i in self.layers[s]}
        self.model = _prune(model, mine, holds_first, holds_last)
        if len(self.stage_ids) == 1:
            self.chunks = [self.model]
        else:
            self.chunks = [stage_view(self.model, self.layers[s], s == 0,
                                      s == self.num_stages - 1) for s in self.stage_ids]
        for chunk in self.chunks:
            parallelize(chunk, mesh, layout, cfg)
            # autocast around each stage's forward only (not around the schedule's backward)
            chunk.register_forward_pre_hook(self._enter_autocast, prepend=True)
            chunk.register_forward_hook(self._exit_autocast, always_call=True)
        self.tied = _TiedEmbedding(self.model, layout, holds_first, holds_last)
        self._scaler = None
        self._autocasts: list = []
        self._schedules: dict = {}
        self._losses: list[torch.Tensor] = []
        self._loss_divisor = 1
        # per micro-batch [mbs] sample losses, kept while a run asks for them (else None)
        self._sample_losses: list[torch.Tensor] | None = None
        self.last_sample_losses = torch.zeros(0)

    # -- construction helpers ------------------------------------------------------------
    def _static_microbatches(self) -> int:
        """The micro-batch count when it is fixed by the config (0 when it follows a ramped
        global batch), validated early."""
        cfg = self.cfg
        if cfg.train.rampup_batch_size and not cfg.parallel.pipeline_microbatches:
            return 0
        samples = cfg.train.global_batch_size // self.layout.dp
        count = cfg.parallel.pipeline_microbatches or samples // cfg.train.micro_batch_size
        self._check_microbatches(count, samples, strict=True)
        return count

    def _check_microbatches(self, count: int, samples: int, strict: bool = False) -> None:
        """``strict`` (the configured full batch): also the schedule's own constraints. Steps of
        a batch-size ramp-up that miss them run the GPipe order instead (``_schedule_kind``)."""
        pp, name = self.layout.pp, self.schedule_name
        if samples % count:
            raise UserError(f"parallel.pipeline_microbatches {count}: does not divide the "
                            f"{samples} samples per data-parallel rank of a step "
                            "(train.global_batch_size / dp)")
        if not strict:
            return
        if name == "1f1b" and count < pp:
            raise UserError(f"parallel.pipeline_schedule 1f1b needs at least "
                            f"parallel.pipeline_parallel = {pp} micro-batches per step, got "
                            f"{count}: raise train.global_batch_size or "
                            "parallel.pipeline_microbatches")
        if name == "interleaved" and count % max(1, count // pp):
            raise UserError(f"parallel.pipeline_schedule interleaved: {count} micro-batches "
                            f"per step must be a multiple of {max(1, count // pp)} "
                            f"(micro-batches // parallel.pipeline_parallel {pp})")

    def _enter_autocast(self, module, args):
        context = self.autocast()
        context.__enter__()
        self._autocasts.append(context)

    def _exit_autocast(self, module, args, output):
        self._autocasts.pop().__exit__(None, None, None)

    def _schedule(self, count: int, shape: tuple, training: bool):
        """The schedule for ``count`` micro-batches of ``shape``, built on first use. Stage
        buffers are sized from the first micro-batch, so each shape (a sequence-length
        curriculum, an evaluation remainder) gets its own stages and schedule."""
        key = (count, shape, training)
        if key not in self._schedules:
            stages = [_Stage(chunk, s, self.num_stages, self.device, group=self.pp_group)
                      for chunk, s in zip(self.chunks, self.stage_ids, strict=True)]
            kind = self._schedule_kind(count, training, len(stages))
            multi = kind in (ScheduleInterleaved1F1B, ScheduleLoopedBFS)
            schedule = kind(stages if multi else stages[0], count, loss_fn=self._loss,
                            scale_grads=False)
            self._schedules[key] = (schedule, stages)
        return self._schedules[key]

    def _schedule_kind(self, count: int, training: bool, local_stages: int):
        """The configured schedule; the GPipe order (all forwards, then all backwards: the same
        gradients) for evaluation, which has no backward to interleave, and for steps whose
        micro-batch count the configured schedule does not take (1F1B needs at least pp,
        interleaved 1F1B a multiple of count // pp: a ramp-up's small batches)."""
        gpipe = ScheduleGPipe if local_stages == 1 else ScheduleLoopedBFS
        pp, name = self.layout.pp, self.schedule_name
        if not training or name == "gpipe" or (name == "1f1b" and count < pp) or (
                name == "interleaved" and count % max(1, count // pp)):
            return gpipe
        return Schedule1F1B if name == "1f1b" else ScheduleInterleaved1F1B

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The last stage's loss for one micro-batch: the fp32 mean cross-entropy, recorded,
        and divided by the micro-batch count (and scaled for fp16) for backward."""
        if self._sample_losses is None:
            loss = self.loss_fn(logits, labels)
        else:
            loss, token_losses = token_cross_entropy(logits, labels)
            self._sample_losses.append(per_sample_means(token_losses, labels))
        self._losses.append(loss.detach())
        scaled = loss / self._loss_divisor
        return self._scaler.scale(scaled) if self._scaler is not None else scaled

    # -- running -------------------------------------------------------------------------
    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def holds_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def _run(self, tokens: torch.Tensor, count: int, training: bool,
             activation_stats: bool = False, per_sample: bool = False) -> torch.Tensor:
        """One schedule step over ``tokens`` [b, L + 1] split into ``count`` micro-batches;
        returns the per-micro-batch losses on every rank ([count], fp32). With
        ``per_sample``, the last stage also keeps each sample's loss in
        ``self.last_sample_losses`` ([b], in order; zeros on the other stages)."""
        tokens = tokens.to(self.device, non_blocking=True)
        shape = (tokens.shape[0] // count, tokens.shape[1] - 1)
        schedule, stages = self._schedule(count, shape, training)
        for stage in stages:
            stage.activation_stats = activation_stats
        self._losses = []
        self._sample_losses = [] if per_sample else None
        self._loss_divisor = count
        # contiguous: torch 2.11 checks each micro-batch's strides against the first
        # one's, recorded contiguous (torch_compat.py), and a view of [b, L + 1] is not
        args = (tokens[:, :-1].contiguous(),) if self.holds_first else ()
        target = tokens[:, 1:] if self.holds_last else None
        context = self.loss_context() if self.loss_context is not None else nullcontext()
        with context:
            if training:
                schedule.step(*args, target=target, return_outputs=False)
            else:
                schedule.eval(*args, target=target, return_outputs=False)
        # the last ``count``: the stage's first step also calls the loss once to infer
        # gradient shapes (metadata inference, before the micro-batches run)
        losses = (torch.stack(self._losses[-count:]).float() if self.holds_last
                  else torch.zeros(count, device=self.device))
        if per_sample:  # as the losses: the last ``count`` micro-batches' (shape inference)
            self.last_sample_losses = (torch.cat(self._sample_losses[-count:]).float()
                                       if self.holds_last
                                       else torch.zeros(tokens.shape[0], device=self.device))
            self._sample_losses = None
        # the last stage has them: every rank needs them to log and to skip in agreement
        dist.broadcast(losses, group=self.pp_group, group_src=self.layout.pp - 1)
        return losses

    def train_step(self, micro_batches: list[torch.Tensor], lr: float, optimizer, precision,
                   activation_stats: bool = False, sources: torch.Tensor | None = None,
                   num_sources: int = 0) -> dict:
        """``Trainer.train_step`` under pipeline parallelism: the schedule runs forward and
        backward over the step's micro-batches (concatenated, then split by the schedule into
        ``parallel.pipeline_microbatches``), then the tied gradients are summed, the norm
        clipped over all stages, and ``step.finish_step`` steps (or every rank skips).
        ``sources``: as ``Trainer.train_step`` (the per-source sums come from the last
        stage)."""
        set_learning_rate(optimizer, lr)
        self._scaler = precision.scaler
        tokens = torch.cat(list(micro_batches))
        samples = tokens.shape[0]
        count = self.cfg.parallel.pipeline_microbatches or len(micro_batches)
        self._check_microbatches(count, samples)
        for chunk in self.chunks:
            chunk.train()
        losses = self._run(tokens, count, training=True, activation_stats=activation_stats,
                           per_sample=sources is not None)
        for chunk in self.chunks:
            chunk.set_activation_stats(False)
        loss = dp_mean(losses.mean(), self.dp_group)
        totals = None
        if sources is not None:
            # zeros off the last stage: summed over dp everywhere, then the last stage's sent
            totals = step_source_totals(self.last_sample_losses, sources, num_sources,
                                        self.dp_group)
            dist.broadcast(totals, group=self.pp_group, group_src=self.layout.pp - 1)
        self.tied.all_reduce_grad()
        if self._scaler is not None:
            self._unscale(optimizer)  # an inf/NaN on any stage: every rank skips
        grad_norm = self.clip_grad_norm(max_norm(self.cfg.optimizer.clip_grad))
        return finish_step(optimizer, self._scaler, loss, grad_norm, totals,
                           self.activation_stats if activation_stats else None)

    def _unscale(self, optimizer) -> None:
        """fp16: unscale, then share the inf/NaN finding of every stage with every rank, so
        that all skip the step (and back the scale off) together. GradScaler finds infs per
        rank; we all-reduce its per-device flags (``ShardedGradScaler`` does the same for FSDP,
        but its flag's shape breaks the fused AdamW step). The first stage never scales a loss,
        and the scale is created by the first ``scale()``: make it there too."""
        scaler = self._scaler
        scaler.scale(torch.zeros((), device=self.device))  # creates the scale (once)
        scaler.unscale_(optimizer)
        found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        for flag in found.values():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)

    @torch.no_grad()
    def sample_losses(self, samples) -> torch.Tensor:
        """Each sample's loss ([len(samples)] fp32 on CPU, on every rank; every rank
        evaluates them all, as without pipelining): groups of stages x micro-batches, forward
        only, the last stage's per-sample losses broadcast over pp."""
        for chunk in self.chunks:
            chunk.eval()
        self._scaler = None
        mbs = self.cfg.train.micro_batch_size
        total = len(samples)
        # runs of up to (stages) micro-batches of mbs samples, then the remainder as one
        runs, first = [], 0
        while total - first >= mbs:
            count = min(self.num_stages, (total - first) // mbs)
            runs.append((first, count * mbs, count))
            first += count * mbs
        if first < total:
            runs.append((first, total - first, 1))
        out = []
        for start, size, count in runs:
            tokens = torch.stack([samples[i] for i in range(start, start + size)])
            self._run(tokens, count, training=False, per_sample=True)
            losses = self.last_sample_losses
            dist.broadcast(losses, group=self.pp_group, group_src=self.layout.pp - 1)
            out.append(losses.cpu())
        return torch.cat(out) if out else torch.zeros(0)

    # -- clipping, state -----------------------------------------------------------------
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip every stage's gradients by the norm of the whole model's gradient: each rank's
        squared norm (over its stages; DTensor gradients reduced over their tp/dp shards), summed
        over pp. The tied copy on the last stage is left out of the sum (its twin on the first
        stage counts it, as Megatron does) but clipped like the rest."""
        from torch.distributed.tensor import DTensor

        params = [p for p in self.model.parameters() if p.grad is not None]
        counted = [p for p in params if not (self.tied.is_copy and p is self.tied.weight)]
        square = torch.zeros((), device=self.device)
        for grads in _by_mesh([p.grad for p in counted]):
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            square = square + norm.float() ** 2
        dist.all_reduce(square, op=dist.ReduceOp.SUM, group=self.pp_group)
        total = square.sqrt()
        for group in _by_mesh(params, key=lambda p: p.grad):
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
        return total

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters on every rank, under the single-process names: each
        stage's full (gathered over tp/dp) state, exchanged over pp. The tied weight is held by
        the first and the last stage alike; it appears once."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        state = {name: value.detach().cpu() for name, value in state.items()}
        gathered: list = [None] * self.layout.pp
        dist.all_gather_object(gathered, state, group=self.pp_group)
        merged: dict[str, torch.Tensor] = {}
        for part in gathered:
            for name, value in part.items():
                merged.setdefault(name, value)
        return dict(sorted(merged.items(), key=lambda item: _whole_model_order(item[0])))

    def activation_stats(self) -> dict[str, list[float]]:
        """Per-layer activation stats of all stages, in layer order, on every rank."""
        readings = activation_stats(self.model)
        mine = {int(name): {key: values[i] for key, values in readings.items()}
                for i, name in enumerate(self.model.h.keys())}
        gathered: list = [None] * self.layout.pp
        dist.all_gather_object(gathered, mine, group=self.pp_group)
        layers = {index: value for part in gathered for index, value in part.items()}
        return {key: [layers[i][key] for i in sorted(layers)] for key in readings}


class _Stage(PipelineStage):
    """A PipelineStage whose activation stats (when armed) record micro-batch 0's forward, as
    the loop without pipelining does (not the shape-inference forward, nor the last
    micro-batch's)."""

    activation_stats = False

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.submod.set_activation_stats(self.activation_stats and fwd_chunk_id == 0)
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)


def _whole_model_order(name: str) -> tuple[int, int]:
    """Sort key (stable) putting names in the whole model's order: embedding, blocks by
    number, final LayerNorm."""
    parts = name.split(".")
    if parts[0] == "h":
        return (1, int(parts[1]))
    return (0 if parts[0].startswith("word_embeddings") else 2, 0)


def _by_mesh(items, key=lambda t: t):
    """``items`` grouped by where ``key(item)`` lives: plain tensors together, DTensors by
    mesh and placements (a foreach norm or scale cannot mix them)."""
    groups: dict = {}
    for item in items:
        tensor = key(item)
        spec = getattr(tensor, "device_mesh", None)
        ident = None if spec is None else (id(spec), tuple(tensor.placements))
        groups.setdefault(ident, []).append(item)
    return list(groups.values())


def build_pipeline(model, mesh, layout, cfg, device: torch.device, loss_fn,
                   loss_context=None) -> Pipeline:
    """Split ``model`` (the whole GPT, built and initialized identically on every rank) into
    this rank's pipeline stages, parallelize each, and set up the schedule."""
    return Pipeline(model, mesh, layout, cfg, device, loss_fn, loss_context)
