"""One training step of one rank, run on fake tensors under torch's memory tracker: the
rank's peak memory as the trainer's own code allocates it, without the memory.

``trace_step(cfg, world_size, rank, target)`` builds the rank with ``built_rank(...,
fake=True)`` (the real tp / sp / ZeRO / pipeline / activation-checkpointing code, every
tensor a ``FakeTensor``: sizes and devices, no data, no arithmetic) and runs, inside the
tracker (``torch.distributed._tools``: ``FSDPMemTracker`` when the model is FSDP2-sharded,
which also tells all-gather and reduce-scatter buffers apart, else ``MemTracker``):

A step on zero gradients first creates the optimizer state (as in every step after the
first). Then:

- without pipelining: two micro-batches (one when the step has one) through
  ``ForwardBackward`` (the trainer's forward, loss and backward, gradient reduction
  included), then the optimizer step. More micro-batches add nothing to the peak: each
  one's activations are freed by its backward, and from the second on the accumulated
  gradients are there during the forward.
- with pipelining: the stage's micro-batches in 1F1B order, as many held at once as its
  schedule keeps in flight (1F1B: ``pp - stage``; the plan passes GPipe's all) and one more
  (a forward that runs with gradients held), each stage output kept until its backward as
  torch's schedule keeps it; then the tied-embedding gradient reduction and the optimizer
  step. The schedule itself is not run: its point-to-point transfers need a peer (a fake
  process group returns nothing), so the stage takes a fake input of the shape its
  predecessor sends.

What the tracker counts is every tensor the step's operators allocate, at the moment they
exist: parameters, gradients, optimizer state, saved activations, temporaries, and
communication buffers. It is the allocator-free truth of the step's live tensors; a real
device adds its caching allocator's rounding and fragmentation, and the CUDA context.

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

from bloomline.trainer.config import Config
from bloomline.trainer.plan.rank_build import BuiltRank, built_rank, planned_config
from bloomline.trainer.torch_compat import memory_tracker

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

    def twin(self, q, k, v):
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


def _create_optimizer_state(built: BuiltRank) -> None:
    """An optimizer step on zero gradients, untracked: the optimizer state (created at the
    first step) then exists when the traced step starts, as in every step after the first,
    without tracing a whole step more."""
    for param in built.model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)


def _tracker(built: BuiltRank):
    optimizer = getattr(built.optimizer, "inner", built.optimizer)  # ZeRO-1 wraps one
    return memory_tracker(built.model, optimizer)


def _micro_batch_step(built: BuiltRank, precision, tracker=None) -> int:
    """The unpipelined step's forward and backward, micro-batch by micro-batch as
    ``ForwardBackward.run`` does them (its ``forward_loss``, the gradient reduction on the
    last); ``tracker``'s per-module records are cleared before each (see ``_stage_step``)."""
    from bloomline.trainer.forward_backward import ForwardBackward, loss_functions
    from bloomline.trainer.parallel import set_gradient_sync

    cfg, layout, model = built.cfg, built.layout, built.model
    loss_fn, loss_context = loss_functions(False, layout.tp)
    step = ForwardBackward(model, precision, torch.device("cpu"), layout.tp, loss_fn,
                           loss_context, None)
    # two micro-batches when the step accumulates: the second forward runs with the first's
    # gradients held, the step's peak
    count = min(2, cfg.train.global_batch_size // (layout.dp * cfg.train.micro_batch_size))
    shape = (cfg.train.micro_batch_size, cfg.data.seq_length + 1)
    model.train()
    for index in range(count):
        if tracker is not None:
            tracker.reset_mod_stats()
        set_gradient_sync(model, index == count - 1)
        with loss_context():
            loss = step.forward_loss(torch.randint(0, cfg.model.vocab_size, shape))
            precision.scale(loss / count).backward()
    return 1


def _stage_step(built: BuiltRank, precision, in_flight: int, total: int,
                tracker=None) -> int:
    """The pipelined step of this rank's stage(s) in 1F1B order: ``in_flight - 1`` warm-up
    forwards, then forward / backward pairs (so that ``in_flight`` micro-batches are held at
    once, and later forwards run with the accumulated gradients), then the remaining
    backwards; ``total`` micro-batches in all. ``tracker``'s per-module records are cleared
    before each forward: the trackers keep one forward per module and step (their global
    peak is kept)."""
    from collections import deque

    from bloomline.trainer.parallel import set_gradient_sync

    cfg, layout, pipeline = built.cfg, built.layout, built.pipeline
    mb, seq = cfg.train.micro_batch_size, cfg.data.seq_length
    # a later stage receives its sequence shard under sp, in the residual stream's dtype
    seq_local = seq // layout.tp if cfg.parallel.sequence_parallel else seq
    stream = torch.float32 if cfg.model.residual_fp32 else precision.dtype
    pipeline._loss_divisor = total

    def context():
        return (pipeline.loss_context() if pipeline.loss_context is not None
                else contextlib.nullcontext())

    def one_f_one_b(chunk, stage: int) -> None:
        chunk.train()
        pending: deque = deque()
        done = 0

        def forward():
            if stage == 0:
                tokens = torch.randint(0, cfg.model.vocab_size, (mb, seq + 1))
                inputs, labels = tokens[:, :-1], tokens[:, 1:]
            else:
                inputs = torch.empty(mb, seq_local, cfg.model.hidden_size, dtype=stream,
                                     requires_grad=True)
                labels = torch.randint(0, cfg.model.vocab_size, (mb, seq))
            if tracker is not None:
                tracker.reset_mod_stats()
            with context():
                out = chunk(inputs)
                # the schedule keeps a stage's output until its backward (the last stage's
                # logits too, beside the loss computed from them)
                loss = pipeline._loss(out, labels) if stage == pipeline.num_stages - 1 else None
            pending.append((out, loss))

        def backward():
            nonlocal done
            out, loss = pending.popleft()  # both live through the backward, then go
            done += 1
            set_gradient_sync(chunk, done == total)
            with context():
                if loss is not None:
                    loss.backward()
                else:
                    out.backward(torch.empty_like(out))

        for _ in range(in_flight - 1):
            forward()
        for _ in range(total - in_flight + 1):
            forward()
            backward()
        while pending:
            backward()

    for chunk, stage in zip(pipeline.chunks, pipeline.stage_ids, strict=True):
        one_f_one_b(chunk, stage)
    pipeline.tied.all_reduce_grad()
    return in_flight


def trace_step(cfg: Config, world_size: int, rank: int, target: str = "cuda",
               in_flight: int | None = None) -> TracedStep:
    """Trace one training step of rank ``rank`` of a ``world_size`` run of ``cfg`` for a
    ``target`` device (``cuda`` or ``cpu``) and return its peak (see the module docstring).
    ``in_flight``: the micro-batches a pipeline stage holds at once (the plan passes its
    schedule's count; default: 1F1B's ``pp - stage``, at most the step's micro-batches).
    Raises UserError for a layout the trainer would refuse."""
    from bloomline.trainer.precision import Precision

    cfg = planned_config(cfg, target)
    device_twins = contextlib.ExitStack()
    device_twins.enter_context(_dtensor_propagation_apart())
    if target == "cuda":
        device_twins.enter_context(_gpu_loss_chunks())
    if cfg.model.attention == "flex":
        device_twins.enter_context(_flex_memory_twin())
    with (_clean_caches(), device_twins,
          built_rank(cfg, world_size, rank, fake=True, target=target) as built):
        precision = Precision(cfg.precision, torch.device("cpu"))
        layout = built.layout
        stage = layout.coords[0]
        per_pipeline = cfg.train.global_batch_size // (layout.dp * cfg.train.micro_batch_size)
        if in_flight is None:
            in_flight = min(per_pipeline, layout.pp - stage)
        # one micro-batch past those in flight (when the step has it): its forward runs after
        # a backward, with gradients held
        total = min(per_pipeline, in_flight + 1)

        def step(tracker=None) -> int:
            if built.pipeline is None:
                held = _micro_batch_step(built, precision, tracker)
            else:
                held = _stage_step(built, precision, in_flight, total, tracker)
            built.optimizer.step()
            built.optimizer.zero_grad(set_to_none=True)
            return held

        _create_optimizer_state(built)
        tracker = _tracker(built)
        with tracker:
            held = step(tracker)
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
