"""Pipeline stages on ``torch.distributed.pipelining``: which blocks this rank keeps, the
modules it runs, the tied embedding across the first and last stage, and the schedules over
them. The step that runs a schedule (loss, per-sample losses, clipping, the whole model's
state) is ``step/pipelined.py``'s ``PipelinedRunner``.

Mental model:

- Every rank builds the whole GPT (same seed, same values; on the meta device for the
  planner), then keeps only the modules of its stages by deleting the rest. ``GPT.h`` is a
  ModuleDict keyed "0".."N-1", so the kept blocks keep their names: the stage's state dict is
  a subset of the single-process one, under the same keys, and DCP checkpoints save and
  reshard without renaming.
- Stages: ``pipeline_parallel`` x ``virtual_stages`` (interleaved) or ``pipeline_parallel``
  contiguous runs of blocks (``partition.py``), stage ``s`` on pp rank ``s % pp`` (looping
  assignment, Megatron's and torch's). The first stage embeds, the last applies ``ln_f`` and
  the head; each stage is a pruned GPT wrapped in a ``PipelineStage`` and run by
  ``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``.
- Each stage is parallelized like a whole model (``parallelize``: tp -> activation
  checkpointing -> compile -> dp/ZeRO); ``PipelineStages.model`` is the rank's GPT holding all
  its stages' modules (what the optimizer, the checkpoint and the runner's full state see).
- Tied embedding: see ``_TiedEmbedding``.
- Data parallelism inside a stage (ZeRO 0-3, data_parallel.py): the schedule, not the loop,
  runs backward, and ``PipelineStage`` drives FSDP2 (``replicate`` for ZeRO-0/1,
  ``fully_shard`` for 2/3) itself: it turns gradient sync and resharding off for every
  micro-batch's backward and reduces once after the last (``perform_reduce_grad``). So under
  pipelining ZeRO-2/3 accumulate *unsharded* gradients during the step and ZeRO-3 keeps a
  stage's parameters gathered from their first backward to the end of the step (the memory
  of ZeRO-1 during the step, sharded again between steps); results are the same.
- Each new micro-batch count or shape (batch-size ramp-up, sequence-length warmup, an
  evaluation remainder) builds its own stages and schedule (torch's stages size their
  buffers from the first micro-batch, by one extra forward/backward of shape inference).
  Ramp-up steps with fewer micro-batches than 1F1B takes run the GPipe order.
- ``PipelineStages.actions`` lists a step's compute actions on this rank (forward, backward,
  gradient reduction per stage and micro-batch) as the schedule object orders them: what the
  planner replays on fake tensors (a fake process group cannot carry the schedule's
  transfers).
- Sent outputs are released (Megatron's ``deallocate_output_tensor``). torch's schedules keep
  each micro-batch's stage output (``PipelineStage.fwd_cache``) until its backward, which needs
  only the output's autograd graph and the gradient received for it, not its values. Once the
  schedule has waited the send of a forward's output (``torch_compat.after_sends_waited``
  follows torch's waits), ``_Stage`` replaces the output's data by one element expanded to its
  shape (``release_output``), and so the detached alias torch's send op and work hold: the
  [mbs, seq, hidden] buffer is freed there, the tensor and its ``grad_fn`` stay for backward.
  Not released: the last stage's output (it goes to the loss), an output not sent, and one
  ``release_output`` refuses (a view, a DTensor, one its own autograd node saves). Where torch
  2.13 waits the forward sends: Schedule1F1B after the next forward in the warm-up, else
  before the next backward (stage 0 then holds one output's data, not ``pp``); ScheduleGPipe
  after the last forward (its backward phase holds none); the runtime schedules
  (ScheduleInterleaved1F1B, ScheduleLoopedBFS) only at the end of the step, so there nothing
  is released before each output's backward, as before. ``actions(..., sends=True)`` marks
  these points (``SENT``) for the planner, which releases its fake outputs with the same
  function there.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

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

from bloomline.trainer.parallel import parallelize
from bloomline.trainer.parallel.grad_buffers import set_sync
from bloomline.trainer.parallel.partition import partition_layers
from bloomline.trainer.torch_compat import after_sends_waited, sends_followed

__all__ = ["PipelineStages", "StageAction", "num_pipeline_stages", "release_output",
           "stage_view"]


def num_pipeline_stages(cfg) -> int:
    p = cfg.parallel
    return p.pipeline_parallel * (p.virtual_stages if p.pipeline_schedule == "interleaved"
                                  else 1)


class StageAction(NamedTuple):
    """One compute action of a pipeline step on this rank: ``kind`` F (forward), B (full
    backward) or REDUCE_GRAD (the stage's data-parallel gradient reduction after its last
    backward), of ``stage`` for ``micro_batch`` (None for REDUCE_GRAD). With
    ``actions(..., sends=True)`` also SENT: the schedule has waited the send of that
    forward's output, which is released there (``release_output``)."""

    kind: str
    stage: int
    micro_batch: int | None


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

    def all_reduce_grad(self, rows: torch.Tensor | None = None) -> None:
        """Sum the two copies' gradients: ``rows`` (the buffers engine: this rank's owned
        rows of the gradient, laid out alike on both stages) or the weight's ``.grad``."""
        if rows is not None:
            dist.all_reduce(rows, op=dist.ReduceOp.SUM, group=self.group)
            return
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


class PipelineStages:
    """This rank's pipeline stages (``chunks``: one module per local stage, parallelized),
    the rank's ``model`` holding them, the tied embedding, and the schedules over them."""

    def __init__(self, model, mesh, layout, cfg, device: torch.device, precision,
                 micro_batch_size: int) -> None:
        self.cfg, self.layout, self.mesh, self.device = cfg, layout, mesh, device
        self.autocast = precision.autocast  # around each stage's forward (the hooks below)
        pp, rank = layout.pp, layout.pp_rank
        self.schedule_name = cfg.parallel.pipeline_schedule
        self.num_stages = num_pipeline_stages(cfg)
        self.pp_group = mesh["pp"].get_group()
        self.stage_ids = list(range(rank, self.num_stages, pp))
        # micro_batch_size: the pipeline's micro-batches' size (a profiled partition times
        # the blocks at it)
        self.layers = partition_layers(model, cfg, self.num_stages, micro_batch_size,
                                       precision.dtype)
        mine = {i for s in self.stage_ids for i in self.layers[s]}
        self.model = _prune(model, mine, self.holds_first, self.holds_last)
        if len(self.stage_ids) == 1:
            self.chunks = [self.model]
        else:
            self.chunks = [stage_view(self.model, self.layers[s], s == 0,
                                      s == self.num_stages - 1) for s in self.stage_ids]
        self._autocasts: list = []
        for chunk in self.chunks:
            parallelize(chunk, mesh, layout, cfg)
            # autocast around each stage's forward only (not around the schedule's backward)
            chunk.register_forward_pre_hook(self._enter_autocast, prepend=True)
            chunk.register_forward_hook(self._exit_autocast, always_call=True)
        self.tied = _TiedEmbedding(self.model, layout, self.holds_first, self.holds_last)
        self._schedules: dict = {}

    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def holds_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def _enter_autocast(self, module, args):
        context = self.autocast()
        context.__enter__()
        self._autocasts.append(context)

    def _exit_autocast(self, module, args, output):
        self._autocasts.pop().__exit__(None, None, None)

    def schedule(self, count: int, shape: tuple, training: bool, loss_fn):
        """The schedule for ``count`` micro-batches of ``shape`` ([mbs, L]) calling
        ``loss_fn(logits, labels)`` on the last stage, and its stages; built on first use.
        Stage buffers are sized from the first micro-batch, so each shape (a sequence-length
        curriculum, an evaluation remainder) gets its own stages and schedule."""
        key = (count, shape, training)
        if key not in self._schedules:
            stages = [_Stage(chunk, s, self.num_stages, self.device, group=self.pp_group)
                      for chunk, s in zip(self.chunks, self.stage_ids, strict=True)]
            kind = self.schedule_kind(count, training)
            multi = kind in (ScheduleInterleaved1F1B, ScheduleLoopedBFS)
            schedule = kind(stages if multi else stages[0], count, loss_fn=loss_fn,
                            scale_grads=False)
            self._schedules[key] = (schedule, stages)
        return self._schedules[key]

    def schedule_kind(self, count: int, training: bool):
        """The configured schedule; the GPipe order (all forwards, then all backwards: the same
        gradients) for evaluation, which has no backward to interleave, and for steps whose
        micro-batch count the configured schedule does not take (1F1B needs at least pp,
        interleaved 1F1B a multiple of count // pp: a ramp-up's small batches)."""
        gpipe = ScheduleGPipe if len(self.chunks) == 1 else ScheduleLoopedBFS
        pp, name = self.layout.pp, self.schedule_name
        if not training or name == "gpipe" or (name == "1f1b" and count < pp) or (
                name == "interleaved" and count % max(1, count // pp)):
            return gpipe
        return Schedule1F1B if name == "1f1b" else ScheduleInterleaved1F1B

    def actions(self, count: int, shape: tuple, loss_fn,
                sends: bool = False) -> list[StageAction]:
        """This rank's compute actions of a training step of ``count`` micro-batches of
        ``shape``, in the order the schedule object gives (its ``pipeline_order``; idle slots
        left out). Micro-batches are numbered per stage and kind in the order they run: every
        torch schedule runs a stage's forwards, and its backwards, in micro-batch order, and
        the single-stage orders number the last rank's forwards from 1. With ``sends``, a
        SENT action where the schedule waits a forward's send and ``_Stage`` releases the
        output (``_send_waits``)."""
        schedule, _ = self.schedule(count, shape, True, loss_fn)
        seen: dict = {}
        actions = []
        for action in schedule.pipeline_order[self.layout.pp_rank]:
            if action is None:
                continue
            kind, stage = action.computation_type.value, action.stage_index
            if kind == "REDUCE_GRAD":
                actions.append(StageAction(kind, stage, None))
                continue
            index = seen.get((kind, stage), 0)
            seen[(kind, stage)] = index + 1
            actions.append(StageAction(kind, stage, index))
        if sends:
            return _send_waits(type(schedule), actions, self.num_stages - 1)
        return actions


def _send_waits(kind, actions: list[StageAction], last_stage: int) -> list[StageAction]:
    """``actions`` (one rank's, of a schedule of class ``kind``) with a SENT action where the
    schedule waits the send of each forward's output (what ``_Stage`` releases there), as torch
    2.13's schedules wait them (``test_parallel_pp`` records a real run's against these):

    - Schedule1F1B: a warm-up forward's send is waited after the next forward (before its own
      send goes), the others' (the last warm-up forward's, fused with the first backward's
      receive, and each steady-state one's) before the next backward;
    - ScheduleGPipe: all of them, in order, after the last forward;
    - the runtime schedules (ScheduleInterleaved1F1B, ScheduleLoopedBFS): at the end of the
      step, last sent first (each output's backward has run by then: nothing to release).

    The last stage sends nothing. Another schedule, or a torch whose waits
    ``torch_compat.after_sends_waited`` cannot follow, gets no SENT (nothing is released)."""
    if not sends_followed():
        return actions
    sent = [a for a in actions if a.kind == "F" and a.stage != last_stage]
    marks = [StageAction("SENT", a.stage, a.micro_batch) for a in sent]
    if kind is Schedule1F1B:
        out: list[StageAction] = []
        waiting = None
        for action in actions:
            if action.kind == "B" and waiting is not None:
                out.append(waiting)
                waiting = None
            out.append(action)
            if action.kind == "F":
                if waiting is not None:
                    out.append(waiting)
                waiting = (StageAction("SENT", action.stage, action.micro_batch)
                           if action.stage != last_stage else None)
        return out + ([waiting] if waiting is not None else [])
    if kind is ScheduleGPipe:
        if not marks:
            return actions
        last_forward = max(i for i, a in enumerate(actions) if a.kind == "F")
        return actions[:last_forward + 1] + marks + actions[last_forward + 1:]
    if kind in (ScheduleInterleaved1F1B, ScheduleLoopedBFS):
        return actions + marks[::-1]
    return actions


def release_output(output: torch.Tensor, aliases=()) -> bool:
    """Free ``output``'s data, keeping the tensor (shape, dtype, device) and its autograd graph
    (``grad_fn``), as Megatron's ``deallocate_output_tensor`` does with a stage output sent to
    the next stage: its backward needs only the graph and the incoming gradient. The data
    becomes one element expanded to the output's shape (stride 0), so
    ``torch.autograd.backward(output, grad)`` still finds matching sizes without Megatron's
    custom C++ backward call. ``aliases``: tensors sharing ``output``'s storage (the detached
    copies torch's send ops hold), released with it. Returns whether it released.

    Refused (False, nothing changed): a DTensor (its local shard is held inside it), a view
    (its base holds the storage), a leaf requiring gradients (an input handed through), an
    output of at most one element or already released, and an output its own autograd node
    saves (exp, sigmoid, ...: the node keeps its own reference to the data, which freeing the
    tensor's would not free; autograd would still read the right values through it). A GPT
    stage's output is a block's residual add (``AddBackward0``, which saves nothing)."""
    from torch.distributed.tensor import DTensor

    if (not isinstance(output, torch.Tensor) or isinstance(output, DTensor)
            or output._is_view() or (output.grad_fn is None and output.requires_grad)
            or output.numel() <= 1 or _saves_own_result(output)
            or output.untyped_storage().nbytes() <= output.element_size()):
        return False
    if aliases:
        storage = output.untyped_storage().data_ptr()
        for alias in aliases:
            if (isinstance(alias, torch.Tensor) and not isinstance(alias, DTensor)
                    and alias is not output and alias.untyped_storage().data_ptr() == storage):
                _drop_data(alias)
    _drop_data(output)
    return True


def _drop_data(tensor: torch.Tensor) -> None:
    tensor.data = torch.empty((), dtype=tensor.dtype, device=tensor.device).expand(tensor.shape)


def _saves_own_result(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s autograd node saves it for its backward: a built-in node that
    does has a ``_saved_result`` attribute (``_saved_result<n>`` for its output n; a layer
    norm's saved ``result1``/``result2`` are its statistics, not its output). Read on the node's
    class: reading it on the node would unpack the saved tensor (and run saved-tensor hooks).
    A custom Function's node (a compiled block) cannot be told: freeing its output is still
    correct (autograd saves an output as a separate alias of its data), only not a saving."""
    node = tensor.grad_fn
    if node is None:
        return False
    cls = type(node)
    return hasattr(cls, "_saved_result") or hasattr(cls, f"_saved_result{tensor.output_nr}")


class _Stage(PipelineStage):
    """A PipelineStage that releases each forward's output once the schedule has waited its
    send (see the module docstring), and whose activation stats (when armed) record
    micro-batch 0's forward, as the loop without pipelining does (not the shape-inference
    forward, nor the last micro-batch's)."""

    activation_stats = False

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.submod.set_activation_stats(self.activation_stats and fwd_chunk_id == 0)
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                           last_backward=False):
        # the buffers engine reduces a bucket as soon as the stage's last backward completes
        # it, overlapping the rest of that backward (FSDP2 modules: the stage's own handling)
        set_sync(self.submod, last_backward)
        return super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                          last_backward=last_backward)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list:
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if not self.is_last:
            after_sends_waited(ops, partial(self.release_sent, fwd_chunk_id))
        return ops

    def release_sent(self, fwd_chunk_id: int, ops: list) -> None:
        """The schedule has waited ``ops``, the sends of micro-batch ``fwd_chunk_id``'s output:
        release the output (kept in ``fwd_cache`` for its backward) and the aliases of it the
        ops (and the works torch keeps until it drops them) hold. Nothing when its backward has
        already run (the runtime schedules wait at the end of the step), and never an output
        that is one of the stage's inputs (its receive buffer, reused every step)."""
        cached = self.fwd_cache.get(fwd_chunk_id)
        if cached is None:
            return
        outputs, inputs = cached
        held = {t.untyped_storage().data_ptr() for t in inputs
                if isinstance(t, torch.Tensor) and not hasattr(t, "placements")}
        aliases = [op.tensor for op in ops]
        for output in outputs:
            if (isinstance(output, torch.Tensor) and not hasattr(output, "placements")
                    and output.untyped_storage().data_ptr() in held):
                continue
            release_output(output, aliases)
