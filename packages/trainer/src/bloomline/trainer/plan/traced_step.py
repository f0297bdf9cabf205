"""One training step of one rank, run on fake tensors under torch's memory tracker: the
rank's peak memory as the trainer's own code allocates it, without the memory.

``trace_step(cfg, world_size, rank, target)`` builds the rank with ``built_rank(...,
fake=True)`` (the real tp / sp / ZeRO / pipeline / activation-checkpointing code, every
tensor a ``FakeTensor``: sizes and devices, no data, no arithmetic) and runs, inside the
tracker (``torch.distributed._tools``: ``FSDPMemTracker`` when the model is FSDP2-sharded,
which also tells all-gather and reduce-scatter buffers apart, else ``MemTracker``):

A step on zero gradients first creates the optimizer state (as in every step after the
first). Then:

- without pipelining: two micro-batches (one when the step has one) through the step
  runner's own ``forward_backward`` (the trainer's forward, loss and backward, gradient
  reduction included), then the optimizer step. More micro-batches add nothing to the peak:
  each one's activations are freed by its backward, and from the second on the accumulated
  gradients are there during the forward.
- with pipelining: the compute actions of the runner's own schedule
  (``PipelinedRunner.actions``, from torch's schedule object) for as many micro-batches as
  the schedule keeps in flight (1F1B: ``pp - stage``; the plan passes GPipe's all) and one
  more (a forward that runs with gradients held), the last stage's loss the runner's; then
  the runner's gradient reductions (the tied embedding) and the optimizer step. Each stage
  output's autograd graph is kept until its backward, as torch's schedule keeps it; its data
  is released where the schedule waits its send (``PipelineStages.actions(..., sends=True)``'s
  SENT, with the run's ``release_output``: under 1F1B a stage then holds one sent output's
  data, not one per micro-batch in flight; the last stage's logits are kept until its
  backward). The schedule's transfers are not run: they need a peer (a fake process group
  returns nothing), so a stage takes a fake input of the shape its predecessor sends.

What the tracker counts is every tensor the step's operators allocate, at the moment they
exist: parameters, gradients, optimizer state, saved activations, temporaries, and
communication buffers; and what the rank held before the step: its parameters, optimizer
state and, on the buffers engine, the fp32 gradient buckets (as gradients) and fp32 master
rows (as optimizer state), which torch's tracker would not find (``torch_compat.track_as``).
It is the allocator-free truth of the step's live tensors; a real device adds its caching
allocator's rounding and fragmentation, and the CUDA context.

``target`` names the device the run is planned for. ``cuda``: the precision ``auto``
resolves to bf16, and ``model.attention = "auto"`` to flex attention, which cannot run on
CPU fake tensors (it compiles a kernel); the trace puts a memory twin in its place, the fused
causal SDPA kernel, which keeps for backward what flex attention keeps (q, k, v, the output
and one fp32 log-sum-exp per row) and no [L, L] scores. ``cpu``: everything as a CPU run
resolves it (eager attention materializing the scores).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bloomline.trainer.build import BuiltRun
from bloomline.trainer.config import Config
from bloomline.trainer.plan.rank_build import built_rank, planned_spec
from bloomline.trainer.step.document_masks import labels_of, model_inputs
from bloomline.trainer.torch_compat import memory_tracker, track_as

__all__ = ["TracedStep", "trace_ranks", "trace_step"]

# the tracker's categories -> the plan's kinds (both trackers' names)
_KINDS = {
    "Parameter": "parameters", "Sharded Param": "parameters",
    "Unsharded Param": "working", "Buffer": "buffers",
    "Gradient": "gradients", "Sharded Grad": "gradients", "Unsharded Grad": "gradients",
    "Activation": "activations", "Temp": "temporary", "Inputs": "activations",
    "Optstate": "optimizer", "OptState": "optimizer",
    "All Gather": "communication", "Reduce Scatter": "communication", "Other": "other",
}


@dataclass(frozen=True)
class TracedStep:
    """The traced step's peak on one rank: ``peak_bytes`` in total and ``at_peak`` by kind
    (parameters, working, gradients, optimizer, activations, temporary, communication,
    buffers, other: what was live at that moment); ``micro_batches`` the micro-batches whose
    activations were held at once; ``attention`` and ``dtype`` as traced."""

    rank: int
    stage: int
    peak_bytes: int
    at_peak: dict[str, int]
    micro_batches: int
    attention: str
    dtype: str


@contextlib.contextmanager
def _flex_memory_twin():
    """Flex attention replaced by the fused causal SDPA kernel (see the module docstring)."""
    from bloomline.trainer.model.attention import Attention

    def twin(self, q, k, v, block_mask=None):
        # a documents' BlockMask skips more blocks than the causal one: a causal twin bounds it
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    original = Attention._flex
    Attention._flex = twin
    try:
        yield
    finally:
        Attention._flex = original


@contextlib.contextmanager
def _gpu_loss_chunks():
    """The fused head + loss walks its logits in the row chunks it uses on a GPU (its CPU
    chunks are sized for a cache and would make the trace walk thousands of them)."""
    from bloomline.trainer.model import loss

    original = loss._CHUNK_BYTES
    loss._CHUNK_BYTES = loss._CHUNK_BYTES_GPU
    try:
        yield
    finally:
        loss._CHUNK_BYTES = original


@contextlib.contextmanager
def _dtensor_propagation_apart():
    """DTensor works out each op's output shape by running it on global-shape fake tensors,
    in the fake mode it finds active: ours, so the tracker would count those global-shape
    tensors (a whole vocabulary's logits where a tp rank holds a slice) as allocations. Given
    a fake mode of its own, they are skipped, as the tracker does in an eager run (the
    trackers of ``torch_compat.memory_tracker``: torch's own skip them from 2.13 on only)."""
    from torch.distributed.tensor import _sharding_prop

    original = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = original


@contextlib.contextmanager
def _clean_caches():
    """Tensors cached across calls (the ALiBi bias) must not carry a fake tensor out of the
    trace, nor a real one into it."""
    from bloomline.trainer.model.alibi import cached_alibi_bias

    cached_alibi_bias.cache_clear()
    try:
        yield
    finally:
        cached_alibi_bias.cache_clear()


def _create_optimizer_state(built: BuiltRun) -> None:
    """An optimizer step on zero gradients, untracked: the optimizer state (created at the
    first step) then exists when the traced step starts, as in every step after the first,
    without tracing a whole step more. The buffers engine steps on its own zeroed gradient
    buffers (a parameter's ``.grad`` is not read there)."""
    if getattr(built.optimizer, "buffers", None) is None:
        for param in built.model.parameters():
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)


def _tracker(built: BuiltRun):
    """The memory tracker of the rank's model and optimizer (``torch_compat``). The buffers
    engine's fp32 gradient buckets count as gradients and its fp32 master rows (the inner
    optimizer's parameters) as optimizer state; the tracker would not count either (they are
    made before the step, and are no parameter's ``.grad`` nor the optimizer's ``state``)."""
    optimizer = built.optimizer
    inner = getattr(optimizer, "inner", optimizer)  # ZeRO-1's sharded optimizers wrap one
    tracker = memory_tracker(built.model, inner)
    buffers = getattr(optimizer, "buffers", None)
    if buffers is not None:
        track_as(tracker, "gradients", [held for bucket in buffers.buckets
                                        for held in (bucket.buffer, bucket.shard)])
        track_as(tracker, "optimizer", [master for group in inner.param_groups
                                        for master in group["params"]])
    return tracker


@contextlib.contextmanager
def _buffers_engine_tracked(built: BuiltRun, tracker):
    """What the tracked step needs on the buffers engine (nothing on another):

    - ZeRO-2 makes a bucket's fp32 buffer when the micro-batch's first gradient of the bucket
      arrives and frees it once reduced: counted as gradients, not as the backward's
      temporaries (the tracker's kind for a tensor made in backward).
    - The tracker's own post-accumulate-grad hook reads each parameter's ``.grad`` after the
      engine's hook has added it to its bucket and dropped it: torch warns, once per
      parameter, that it got None, which is what the engine means.
    """
    import warnings

    buffers = getattr(built.optimizer, "buffers", None)
    buckets = [b for b in buffers.buckets if b.sharded_grads] if buffers is not None else []

    def counted(make):
        def new_buffer():
            buffer = make()
            track_as(tracker, "gradients", [buffer], move=True)
            return buffer
        return new_buffer

    for bucket in buckets:
        bucket._new_buffer = counted(bucket._new_buffer)
    try:
        with warnings.catch_warnings():
            if buffers is not None:
                warnings.filterwarnings("ignore", message="Expected a tensor or a traceable "
                                        "wrapper-subclass of tensor, but got <class 'NoneType'>")
            yield
    finally:
        for bucket in buckets:
            del bucket._new_buffer  # the class's again


@contextlib.contextmanager
def _per_forward_records(modules, tracker):
    """``tracker``'s per-module records cleared before each forward of ``modules``: the
    trackers keep one forward per module and step (their global peak is kept). A global
    forward pre-hook, entered before the tracker: it then runs before the tracker's own
    hooks (global ones, or the module's), which record the forward that starts."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    ids = {id(module) for module in modules}

    def reset(module, args) -> None:
        if id(module) in ids:
            tracker.reset_mod_stats()

    handle = register_module_forward_pre_hook(reset)
    try:
        yield
    finally:
        handle.remove()


def _micro_batch_step(built: BuiltRun) -> int:
    """The unpipelined step's forward and backward: the runner's own ``forward_backward``
    (the trainer's forward, loss, backward and gradient reduction) over two micro-batches
    when the step accumulates: the second forward runs with the first's gradients held, the
    step's peak. More add nothing: each one's activations are freed by its backward."""
    cfg, layout = built.spec.config, built.spec.layout
    count = min(2, cfg.train.global_batch_size // (layout.dp * cfg.train.micro_batch_size))
    shape = (cfg.train.micro_batch_size, cfg.data.seq_length + 1)
    built.runner.forward_backward([torch.randint(0, cfg.model.vocab_size, shape)
                                   for _ in range(count)])
    return 1


def _stage_step(built: BuiltRun, total: int) -> int:
    """The pipelined step of this rank's stage(s): the compute actions of the runner's
    schedule for ``total`` micro-batches (``PipelineStages.actions`` with ``sends``: forwards,
    backwards and gradient reductions in the schedule's order, and where it waits each
    forward's send), each stage output kept until its backward as torch's schedule keeps it,
    its data released at the wait of its send as ``_Stage`` releases it (``release_output``).
    A stage after the first takes a fake input of the shape its predecessor sends (the
    schedule's transfers need a peer). Returns the most micro-batches held at once."""
    from bloomline.trainer.parallel.data_parallel import set_gradient_sync
    from bloomline.trainer.parallel.pipeline import release_output

    cfg, layout, runner = built.spec.config, built.spec.layout, built.runner
    mb, seq = cfg.train.micro_batch_size, cfg.data.seq_length
    # a later stage receives its sequence shard under sp, in the residual stream's dtype
    seq_local = seq // layout.tp if cfg.parallel.sequence_parallel else seq
    stream = torch.float32 if cfg.model.residual_fp32 else built.precision.dtype
    chunks = dict(zip(built.stages, built.chunks, strict=True))
    last_stage = runner.stages.num_stages - 1
    actions = runner.stages.actions(total, (mb, seq), runner.micro_batch_loss, sends=True)
    last_backward = {a.stage: a.micro_batch for a in actions if a.kind == "B"}
    runner.begin_step(total)
    pending: dict = {}
    held = 0
    for chunk in built.chunks:
        chunk.train()
    for action in actions:
        chunk = chunks[action.stage]
        if action.kind == "F":
            tokens = torch.randint(0, cfg.model.vocab_size, (mb, seq + 1))
            # every stage takes the micro-batch's document ids beside its input, as in the run
            extra = model_inputs(runner.documents, tokens[:, :-1])
            labels = labels_of(runner.documents, tokens)
            if action.stage == 0:
                inputs = tokens[:, :-1]
            else:
                inputs = torch.empty(mb, seq_local, cfg.model.hidden_size, dtype=stream,
                                     requires_grad=True)
            with runner.context():
                out = chunk(inputs, **extra)
                # the schedule keeps a stage's output until its backward (the last stage's
                # logits too, beside the loss computed from them); a sent one's data goes at
                # its SENT below
                loss = (runner.micro_batch_loss(out, labels) if action.stage == last_stage
                        else None)
            pending[(action.stage, action.micro_batch)] = (out, loss)
            held = max(held, sum(1 for stage, _ in pending if stage == action.stage))
        elif action.kind == "SENT":  # its send waited: the run's _Stage releases it here
            if (action.stage, action.micro_batch) in pending:
                release_output(pending[(action.stage, action.micro_batch)][0])
        elif action.kind == "B":
            out, loss = pending.pop((action.stage, action.micro_batch))
            set_gradient_sync(chunk, action.micro_batch == last_backward[action.stage])
            with runner.context():
                if loss is not None:
                    loss.backward()
                else:
                    out.backward(torch.empty_like(out))
    runner.reduce_gradients()  # the tied embedding's gradient, as the step does after backward
    return held


def trace_step(cfg: Config, world_size: int, rank: int, target: str = "cuda",
               in_flight: int | None = None) -> TracedStep:
    """Trace one training step of rank ``rank`` of a ``world_size`` run of ``cfg`` for a
    ``target`` device (``cuda`` or ``cpu``) and return its peak (see the module docstring).
    ``in_flight``: the micro-batches a pipeline stage holds at once (the plan passes its
    schedule's count; default: 1F1B's ``pp - stage``, at most the step's micro-batches).
    Raises UserError for a layout the trainer would refuse."""
    spec = planned_spec(cfg, world_size, rank, target)
    cfg = spec.config
    device_twins = contextlib.ExitStack()
    device_twins.enter_context(_dtensor_propagation_apart())
    if target == "cuda":
        device_twins.enter_context(_gpu_loss_chunks())
    if cfg.model.attention == "flex":
        device_twins.enter_context(_flex_memory_twin())
    with (_clean_caches(), device_twins,
          built_rank(cfg, world_size, rank, fake=True, target=target) as built):
        layout = built.spec.layout
        stage = layout.coords[0]
        per_pipeline = cfg.train.global_batch_size // (layout.dp * cfg.train.micro_batch_size)
        if in_flight is None:
            in_flight = min(per_pipeline, layout.pp - stage)
        # one micro-batch past those in flight (when the step has it): its forward runs after
        # a backward, with gradients held
        total = min(per_pipeline, in_flight + 1)
        _create_optimizer_state(built)
        tracker = _tracker(built)
        with (_per_forward_records(built.chunks, tracker),
              _buffers_engine_tracked(built, tracker), tracker):
            if layout.pp == 1:
                held = _micro_batch_step(built)
            else:
                held = _stage_step(built, total)
            built.optimizer.step()
            built.optimizer.zero_grad(set_to_none=True)
        snapshot = tracker.get_tracker_snapshot("peak")
    at_peak: dict[str, int] = {}
    total = 0
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = getattr(key, "value", key)
            if name == "Total":
                total += value
            elif value:
                kind = _KINDS.get(name, "other")
                at_peak[kind] = at_peak.get(kind, 0) + value
    return TracedStep(rank=rank, stage=stage, peak_bytes=total, at_peak=at_peak,
                      micro_batches=held, attention=cfg.model.attention,
                      dtype=cfg.precision.dtype)


def trace_ranks(cfg: Config, world_size: int, ranks: list[int], target: str = "cuda",
                in_flight: list[int | None] | None = None) -> list[TracedStep]:
    """``trace_step`` of each of ``ranks``, each in a fresh process (forked from a server that
    has torch and the trainer imported; as many at once as there are cores). Why not in this
    one: torch keeps process groups' names inside device meshes, DTensor and FSDP2 state, and
    some of it outlives a destroyed process group, so a second fake world in one process can
    be handed the first one's groups. Errors (a UserError for a layout the trainer refuses)
    are raised here as in ``trace_step``. A script calling this needs an ``if __name__ ==
    "__main__":`` guard, as any multiprocessing code does."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from bloomline.trainer.parallel.local_processes import forkserver_context

    flights = in_flight or [None] * len(ranks)
    workers = max(1, min(len(ranks), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1,
                             mp_context=forkserver_context()) as pool:
        futures = [pool.submit(trace_step, cfg, world_size, rank, target, flight)
                   for rank, flight in zip(ranks, flights, strict=True)]
        return [future.result() for future in futures]
