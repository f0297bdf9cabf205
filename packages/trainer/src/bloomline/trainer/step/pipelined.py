"""``PipelinedRunner``: the step of this rank's pipeline stages (``parallel/pipeline.py``'s
``PipelineStages``) under torch's schedule.

- The loss runs on the last stage in fp32 (``sample_forward.logits_loss``), divided by the
  micro-batch count (``scale_grads=False``): the gradients are those of the mean of the
  micro-batch means, as in the plain runner. The loss is averaged over dp and broadcast from
  the last stage, so every rank logs it and takes the same NaN-skip decision. Per-sample
  losses (evaluation, the per-source train loss at log steps) also come from the last stage:
  summed per dataset over dp there, then broadcast over pp like the loss.
- Tied embedding: after backward the two copies' gradients are summed
  (``PipelineStages.tied``). Gradient-norm clipping: see ``clip_grad_norm``.
- fp16: the loss scale is shared (every rank unscales; an inf/NaN on any stage makes every
  rank skip), see ``unscale``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from bloomline.trainer.config_rules import check_step_microbatches
from bloomline.trainer.parallel.pipeline import PipelineStages, StageAction
from bloomline.trainer.reporting.metrics import activation_stats as read_activation_stats
from bloomline.trainer.step.document_masks import labels_of, model_inputs
from bloomline.trainer.step.runner import StepRunner
from bloomline.trainer.step.sample_forward import logits_loss
from bloomline.trainer.step.tail import dp_mean, step_source_totals

__all__ = ["PipelinedRunner"]


class PipelinedRunner(StepRunner):
    """The step of ``stages`` (this rank's) with ``optimizer`` and ``precision``."""

    def __init__(self, stages: PipelineStages, optimizer, precision, tp_mesh, loss_fn,
                 loss_context, dp_group, clip_grad: float, micro_batch_size: int) -> None:
        super().__init__(stages.model, optimizer, precision, clip_grad, micro_batch_size)
        self.stages, self.layout, self.device = stages, stages.layout, stages.device
        self.tp_mesh = tp_mesh  # the tp axis activation stats reduce over (None: no tp)
        self.loss_fn, self.loss_context, self.dp_group = loss_fn, loss_context, dp_group
        self.microbatches = stages.cfg.parallel.pipeline_microbatches  # 0: one per batch
        self._scaler = None
        self._losses: list[torch.Tensor] = []
        self._loss_divisor = 1
        # per micro-batch [mbs] sample losses, kept while a run asks for them (else None)
        self._sample_losses: list[torch.Tensor] | None = None
        self.last_sample_losses = torch.zeros(0)

    # -- the last stage's loss ---------------------------------------------------------------
    def begin_step(self, count: int, training: bool = True, per_sample: bool = False) -> None:
        """Before a schedule step of ``count`` micro-batches: the losses recorded from here,
        each divided by ``count`` (and scaled for fp16 in training) for backward."""
        self._scaler = self.precision.scaler if training else None
        self._losses = []
        self._sample_losses = [] if per_sample else None
        self._loss_divisor = count

    def micro_batch_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The last stage's loss for one micro-batch (the schedule's ``loss_fn``): the fp32
        mean cross-entropy, recorded, and divided by the micro-batch count (and scaled for
        fp16) for backward."""
        if self._sample_losses is None:
            loss = logits_loss(self.loss_fn, logits, labels)
        else:
            loss, samples = logits_loss(self.loss_fn, logits, labels, per_sample=True)
            self._sample_losses.append(samples)
        self._losses.append(loss.detach())
        scaled = loss / self._loss_divisor
        return self._scaler.scale(scaled) if self._scaler is not None else scaled

    def context(self):
        """The loss context (``loss_parallel`` under tp) the stages' forward and backward run
        in."""
        return self.loss_context() if self.loss_context is not None else nullcontext()

    def actions(self, count: int, shape: tuple) -> list[StageAction]:
        """This rank's compute actions of a training step of ``count`` micro-batches of
        ``shape`` ([mbs, L]), as the schedule runs them (``PipelineStages.actions``)."""
        return self.stages.actions(count, shape, self.micro_batch_loss)

    # -- running -----------------------------------------------------------------------------
    def _run(self, tokens: torch.Tensor, count: int, training: bool,
             activation_stats: bool = False, per_sample: bool = False) -> torch.Tensor:
        """One schedule step over ``tokens`` [b, L + 1] split into ``count`` micro-batches;
        returns the per-micro-batch losses on every rank ([count], fp32). With
        ``per_sample``, the last stage also keeps each sample's loss in
        ``self.last_sample_losses`` ([b], in order; zeros on the other stages)."""
        stages = self.stages
        tokens = tokens.to(self.device, non_blocking=True)
        shape = (tokens.shape[0] // count, tokens.shape[1] - 1)
        schedule, torch_stages = stages.schedule(count, shape, training,
                                                 self.micro_batch_loss)
        for stage in torch_stages:
            stage.activation_stats = activation_stats
        self.begin_step(count, training, per_sample)
        # contiguous: torch 2.11 checks each micro-batch's strides against the first
        # one's, recorded contiguous (torch_compat.py), and a view of [b, L + 1] is not
        args = (tokens[:, :-1].contiguous(),) if stages.holds_first else ()
        target = labels_of(self.documents, tokens) if stages.holds_last else None
        # every stage's document ids, from the tokens every rank is given: torch's schedules
        # split keyword inputs into micro-batches and hand them to every stage's forward
        # (only positional ones travel from stage to stage)
        kwargs = model_inputs(self.documents, tokens[:, :-1])
        with self.context():
            if training:
                schedule.step(*args, target=target, return_outputs=False, **kwargs)
            else:
                schedule.eval(*args, target=target, return_outputs=False, **kwargs)
        # the last ``count``: the stage's first step also calls the loss once to infer
        # gradient shapes (metadata inference, before the micro-batches run)
        losses = (torch.stack(self._losses[-count:]).float() if stages.holds_last
                  else torch.zeros(count, device=self.device))
        if per_sample:  # as the losses: the last ``count`` micro-batches' (shape inference)
            self.last_sample_losses = (torch.cat(self._sample_losses[-count:]).float()
                                       if stages.holds_last
                                       else torch.zeros(tokens.shape[0], device=self.device))
            self._sample_losses = None
        # the last stage has them: every rank needs them to log and to skip in agreement
        dist.broadcast(losses, group=stages.pp_group, group_src=self.layout.pp - 1)
        return losses

    def forward_backward(self, micro_batches: list[torch.Tensor],
                         activation_stats: bool = False, sources: torch.Tensor | None = None,
                         num_sources: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The schedule runs forward and backward over the step's micro-batches
        (concatenated, then split by the schedule into ``parallel.pipeline_microbatches``);
        the per-source sums come from the last stage."""
        self.sections.enter("forward_backward")  # the schedule: its sends and receives too
        tokens = torch.cat(list(micro_batches))
        count = self.microbatches or len(micro_batches)
        check_step_microbatches(count, tokens.shape[0])
        for chunk in self.stages.chunks:
            chunk.train()
        losses = self._run(tokens, count, training=True, activation_stats=activation_stats,
                           per_sample=sources is not None)
        for chunk in self.stages.chunks:
            chunk.set_activation_stats(False)
        self.sections.enter("reduce")
        self.local_loss = losses.mean()  # the last stage's, as every stage has it
        loss = dp_mean(self.local_loss, self.dp_group)
        totals = None
        if sources is not None:
            # zeros off the last stage: summed over dp everywhere, then the last stage's sent
            totals = step_source_totals(self.last_sample_losses, sources, num_sources,
                                        self.dp_group)
            dist.broadcast(totals, group=self.stages.pp_group, group_src=self.layout.pp - 1)
        return loss, totals

    def reduce_gradients(self) -> None:
        tied = self.stages.tied
        if self.distributed is not None and tied.weight is not None:
            # the buffers engine: each stage's owned rows, reduced over dp already
            tied.all_reduce_grad(self.distributed.shard_grad(tied.weight))
        else:
            tied.all_reduce_grad()

    def unscale(self) -> None:
        """fp16: unscale, then share the inf/NaN finding of every stage with every rank, so
        that all skip the step (and back the scale off) together. GradScaler finds infs per
        rank; we all-reduce its per-device flags (``ShardedGradScaler`` does the same for FSDP,
        but its flag's shape breaks the fused AdamW step). The first stage never scales a loss,
        and the scale is created by the first ``scale()``: make it there too."""
        scaler, optimizer = self.precision.scaler, self.optimizer
        scaler.scale(torch.zeros((), device=self.device))  # creates the scale (once)
        scaler.unscale_(optimizer)
        found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        for flag in found.values():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)

    @torch.no_grad()
    def sample_losses(self, samples) -> torch.Tensor:
        """Groups of stages x micro-batches, forward only, the last stage's per-sample losses
        broadcast over pp."""
        for chunk in self.stages.chunks:
            chunk.eval()
        mbs, num_stages = self.micro_batch_size, self.stages.num_stages
        total = len(samples)
        # runs of up to (stages) micro-batches of mbs samples, then the remainder as one
        runs, first = [], 0
        while total - first >= mbs:
            count = min(num_stages, (total - first) // mbs)
            runs.append((first, count * mbs, count))
            first += count * mbs
        if first < total:
            runs.append((first, total - first, 1))
        out = []
        for start, size, count in runs:
            tokens = torch.stack([samples[i] for i in range(start, start + size)])
            self._run(tokens, count, training=False, per_sample=True)
            losses = self.last_sample_losses
            dist.broadcast(losses, group=self.stages.pp_group, group_src=self.layout.pp - 1)
            out.append(losses.cpu())
        return torch.cat(out) if out else torch.zeros(0)

    # -- clipping, state ---------------------------------------------------------------------
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip every stage's gradients by the norm of the whole model's gradient: each rank's
        squared norm (over its stages; DTensor gradients reduced over their tp/dp shards),
        summed over pp. The tied copy on the last stage is left out of the sum (its twin on
        the first stage counts it, as Megatron does) but clipped like the rest."""
        from torch.distributed.tensor import DTensor

        tied = self.stages.tied
        if self.distributed is not None:
            return self.distributed.clip_grad_norm(
                max_norm, leave_out=[tied.weight] if tied.is_copy else [])
        params = [p for p in self.model.parameters() if p.grad is not None]
        counted = [p for p in params if not (tied.is_copy and p is tied.weight)]
        square = torch.zeros((), device=self.device)
        for grads in _by_mesh([p.grad for p in counted]):
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            square = square + norm.float() ** 2
        dist.all_reduce(square, op=dist.ReduceOp.SUM, group=self.stages.pp_group)
        total = square.sqrt()
        for group in _by_mesh(params, key=lambda p: p.grad):
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
        return total

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """Each stage's full (gathered over tp/dp) state, exchanged over pp. The tied weight
        is held by the first and the last stage alike; it appears once."""
        state = self.local_full_state()
        gathered: list = [None] * self.layout.pp
        dist.all_gather_object(gathered, state, group=self.stages.pp_group)
        merged: dict[str, torch.Tensor] = {}
        for part in gathered:
            for name, value in part.items():
                merged.setdefault(name, value)
        return dict(sorted(merged.items(), key=lambda item: _whole_model_order(item[0])))

    def activation_stats(self) -> dict[str, list[float]]:
        """Per-layer activation stats of all stages, in layer order, on every rank."""
        readings = read_activation_stats(self.model, self.tp_mesh, self.grad_reader())
        mine = {int(name): {key: values[i] for key, values in readings.items()}
                for i, name in enumerate(self.model.h.keys())}
        gathered: list = [None] * self.layout.pp
        dist.all_gather_object(gathered, mine, group=self.stages.pp_group)
        layers = {index: value for part in gathered for index, value in part.items()}
        return {key: [layers[i][key] for i in sorted(layers)] for key in readings}


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
