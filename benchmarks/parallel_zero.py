"""The ZeRO part of ``benchmarks.parallel``, the code each rank runs: the tiny GPT's
``Trainer`` config per stage, the per-rank count of the bytes held (parameters, gradients,
optimizer state, the forward peak) and written to sockets, and the ZeRO paper's formula.

Contract: ``zero_worker(dp, variants, steps)`` runs on every rank of ``run_distributed`` and
returns picklable counts per variant; ``zero_theory`` is the formula the report compares with.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import time

import torch

from benchmarks.harness.collectives import bytes_written
from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer

__all__ = ["FP32", "HEADS", "HIDDEN", "LAYERS", "MBS", "SEQ", "VOCAB", "ZERO_VARIANTS",
           "engine_setup", "zero_config", "zero_theory", "zero_worker"]

# the GPT of the ZeRO runs
VOCAB, HIDDEN, LAYERS, HEADS, SEQ, MBS = 2048, 256, 4, 8, 64, 4
# label -> (zero_stage, offload, zero_engine): ZeRO-1/2 on both engines (``auto`` would pick
# the buffers engine for them, FSDP2 for the others)
ZERO_VARIANTS = {"ZeRO-0 (DDP)": (0, False, "fsdp2"),
                 "ZeRO-1 fsdp2": (1, False, "fsdp2"), "ZeRO-1 buffers": (1, False, "buffers"),
                 "ZeRO-2 fsdp2": (2, False, "fsdp2"), "ZeRO-2 buffers": (2, False, "buffers"),
                 "ZeRO-3": (3, False, "fsdp2"), "ZeRO-3 + offload": (3, True, "fsdp2")}
FP32 = 4


def zero_config(dp: int, stage: int, offload: bool, engine: str = "auto"):
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = VOCAB, HIDDEN, LAYERS, HEADS
    m.hidden_dropout = m.attention_dropout = 0.0
    cfg.data.tokenizer, cfg.data.seq_length = "", SEQ
    cfg.train.micro_batch_size, cfg.train.global_batch_size = MBS, MBS * dp
    cfg.train.device, cfg.train.run_dir, cfg.train.seed = "cpu", "/nonexistent", 1234
    cfg.precision.dtype = "fp32"
    cfg.optimizer.name, cfg.optimizer.lr = "adamw", 1e-3
    cfg.monitor.tensorboard = False
    cfg.parallel.zero_stage, cfg.parallel.offload = stage, offload
    cfg.parallel.zero_engine = engine
    return cfg


def engine_setup(dp: int, stage: int, engine: str, precision: str, micro_batches: int):
    """``benchmarks.parallel_engines``' case on this GPT: the config (``precision``,
    ``micro_batches`` of ``MBS`` per rank per step) and the step's micro-batches (the same on
    every rank and every step)."""
    cfg = zero_config(dp, stage, False, engine)
    cfg.precision.dtype = precision
    cfg.train.global_batch_size = MBS * dp * micro_batches
    generator = torch.Generator().manual_seed(0)
    return cfg, [torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=generator)
                 for _ in range(micro_batches)]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # DTensor: this rank's shard
    return to_local() if to_local is not None else tensor


def _storage_bytes(tensors, seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared ones once, freed ones 0)."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = _local(tensor).untyped_storage()
        key = (storage.data_ptr(), storage.device)
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def _inner_optimizer(optimizer):
    """ZeroRedundancyOptimizer keeps its shard's state in ``.optim``."""
    return getattr(optimizer, "optim", optimizer)


def _optimizer_tensors(optimizer):
    for state in _inner_optimizer(optimizer).state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def count_fallback(model, optimizer) -> dict:
    return {"params": _storage_bytes(list(model.parameters())),
            "grads": _storage_bytes([p.grad for p in model.parameters()]),
            "optimizer": _storage_bytes(list(_optimizer_tensors(optimizer)))}


def _counter(offload: bool):
    """Per-rank model-state bytes: the dp helper's ``parallel/memory.py`` when it is there,
    else our fallback (same rules: local shards, each storage once)."""
    try:  # optional: a tree without parallel/memory.py is measured with the fallback
        from bloomline.trainer.parallel.memory import model_state_bytes
    except ImportError:
        def fallback(model, optimizer) -> dict:
            found = count_fallback(model, optimizer)
            return {**found, **{f"{kind}_host": 0 for kind in list(found)}}
        return fallback, "benchmarks.parallel's fallback counter"

    def count(model, optimizer) -> dict:
        found = model_state_bytes(model, optimizer, "cpu", offload)
        held = {}
        for kind, key in (("params", "params"), ("grads", "grads"), ("optimizer", "optim")):
            held[kind] = found[f"{key}_device"] + found[f"{key}_host"]
            held[f"{kind}_host"] = found[f"{key}_host"]
        return held
    return count, "bloomline.trainer.parallel.memory.model_state_bytes"


def _collectives(prof) -> dict[str, list[int]]:
    """gloo collectives of a profiled step: name -> elements of each call's first input."""
    found: dict[str, list[int]] = {}
    for event in prof.events():
        if event.name.startswith("gloo:"):
            shapes = [s for s in (event.input_shapes or []) if s]
            numel = math.prod(shapes[0]) if shapes else 0
            found.setdefault(event.name[len("gloo:"):], []).append(numel)
    return found


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's kineto prints a start and a stop line to fd 2 in every rank."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def zero_worker(dp: int, variants: dict, steps: int) -> dict:
    """On every rank: per variant, memory counts, socket bytes per step, the collectives."""
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(0)
    out = {"variants": {}}
    for label, (stage, offload, engine) in variants.items():
        count, out["counter"] = _counter(offload)
        try:
            trainer = Trainer(zero_config(dp, stage, offload, engine), log=lambda *_: None)
        except Exception as error:  # noqa: BLE001 - a layout not built yet: reported, skipped
            out["variants"][label] = {"error": f"{type(error).__name__}: {error}"[:300]}
            continue
        model, optimizer = trainer.model, trainer.optimizer
        numel = sum(p.numel() for p in trainer.full_model_state().values())
        peak = {"params": 0}
        at_step: dict[str, int] = {}

        # the parameters at rest (FSDP2's shards, replicate's DTensors) stay allocated while
        # forward registers the gathered copies in their place: count both
        resting = list(model.parameters())

        def in_forward(_module, _args, peak=peak, model=model, resting=resting):
            held = _storage_bytes(resting + list(model.parameters()))
            peak["params"] = max(peak["params"], held)

        def step_counted(*args, step=optimizer.step, model=model, optimizer=optimizer,
                         at_step=at_step, count=count, **kwargs):
            at_step.update(count(model, optimizer))
            return step(*args, **kwargs)

        # an instance attribute, as the trainer calls it (our ZeRO-1 optimizer is an
        # Optimizer without the base class's hook machinery)
        optimizer.step = step_counted
        blocks = list(model.h.values())
        hooks = [blocks[-1].register_forward_pre_hook(in_forward)]
        tokens = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=generator)
        lr = trainer.cfg.optimizer.lr
        wire, seconds = [], []
        for index in range(steps + 1):  # the first creates the optimizer state
            dist.barrier()
            before, start = bytes_written(), time.perf_counter()
            trainer.train_step([tokens], lr)
            seconds.append(time.perf_counter() - start)
            wire.append(bytes_written() - before)
            if index == 0:
                peak["params"] = 0
        after = count(model, optimizer)
        dist.barrier()
        from torch.profiler import ProfilerActivity, profile

        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                      record_shapes=True) as prof:
            trainer.train_step([tokens], lr)
        out["variants"][label] = {
            "numel": numel, "params_rest": at_step["params"], "params_peak": peak["params"],
            "grads": at_step["grads"], "optimizer": after["optimizer"],
            "host": at_step["params_host"] + at_step["grads_host"] + after["optimizer_host"],
            "wire": statistics.median(wire[1:]), "seconds": statistics.median(seconds[1:]),
            "collectives": _collectives(prof)}
        for hook in hooks:
            hook.remove()
        del trainer, model, optimizer
        gc.collect()
    return out


def zero_theory(stage: int, offload: bool, numel: int, dp: int) -> dict:
    """The ZeRO paper's model states per rank (fp32 parameters and gradients, Adam) and
    bytes sent per rank (ring collectives: an all-gather or a reduce-scatter sends (N-1)/N of
    the full tensor, an all-reduce twice that); ``gloo``: what this implementation sends on
    gloo, whose reduce-scatter is an all-reduce (it writes the whole tensor, not half of it at
    N = 2; ``benchmarks/results/parallel.md``): fsdp2's ZeRO-1 all-reduces the whole gradient
    then all-gathers the updated shards; the buffers engine (ZeRO-1/2) reduce-scatters its
    fp32 gradient buckets then all-gathers the updated rows (fp32 here), the same count on
    gloo; FSDP2 (ZeRO-2/3) reduce-scatters the gradients and
    all-gathers the parameters once (ZeRO-2) or in forward and again in backward (ZeRO-3)."""
    params = FP32 * numel / (dp if stage >= 3 else 1)
    grads = FP32 * numel / (dp if stage >= 2 else 1)
    optimizer = 2 * FP32 * numel / (dp if stage >= 1 else 1)
    ring = (dp - 1) / dp * FP32 * numel  # one all-gather or reduce-scatter of the model
    gloo = {0: 2, 1: 3, 2: 3, 3: 4}[stage] * ring
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "wire": 3 * ring if stage == 3 else 2 * ring, "gloo": gloo, "offload": offload}
