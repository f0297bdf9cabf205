"""What the parallel layouts cost per rank, measured on CPU (gloo), against the theory each
one is sold by: ZeRO memory, pipeline bubbles, data-parallel communication.

Every part runs its ranks as real processes (``run_distributed`` of the trainer's test
harness: torchrun's environment, gloo, one torch thread per process) on this 2-core machine.

(1) ZeRO memory per rank. ``Trainer`` (the GPT below, fp32 with AdamW, one micro-batch of
    ``MBS`` samples per rank per step) with ``parallel.zero_stage`` 0 (DDP), 1, 2, 3 and 3 +
    ``parallel.offload``, at dp = 2 and dp = 4. On every rank it counts the bytes of the
    tensor storages the rank actually holds (local shards of DTensors; a storage shared by
    several tensors, like FSDP2's padded shards, counted once; one freed by a reshard counts
    0), with the dp helper's ``parallel/memory.py`` (``model_state_bytes``; a fallback here
    with the same rules when it is missing; the output says which): parameters at rest and
    gradients just before ``optimizer.step`` (the step is wrapped), the optimizer state after
    it (m and v; scalar step counters are not counted), and the parameters at their peak in
    forward (in a forward pre-hook of the last block, after FSDP2 has gathered it: the
    storages of the resting parameters plus the gathered copies registered in their place).
    The formula is the ZeRO paper's for fp32 training with Adam (Psi parameters, N = dp):
    parameters 4 Psi, gradients 4 Psi, optimizer state 8 Psi (two moments); stage 1 divides
    the optimizer state by N, stage 2 also the gradients, stage 3 also the parameters; offload
    keeps all three on the host (on a CPU-only machine host and device are the same memory, so
    the offload row can only show that the shards stay 1/N; memory.py counts them as host by
    the setting). The max over ranks is reported (FSDP2 pads dim 0 to a multiple of N).
    Target: model states per rank (parameters at rest + gradients + optimizer state) at most
    1.05x the formula; the peak (peak parameters + gradients + optimizer state) is printed
    beside it, as FSDP2-based stages compute with gathered copies next to the shards.

(2) Pipeline bubble. ``torch.distributed.pipelining`` (``PipelineStage`` and the schedules
    ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``; the trainer's pipeline
    module, when there, is named in the output) on p = 2 (and 4) ranks, m micro-batches of a
    fixed size, identical stages (what the formula assumes). Each rank's busy time is the
    wall time spent inside its stages' ``forward_one_chunk`` / ``backward_one_chunk`` /
    ``backward_weight_one_chunk`` (timed by wrapping those methods on the stage objects: the
    schedule waits for received activations before calling them, so waiting is outside);
    the step's wall time is the longest ``schedule.step`` of the ranks, which start it
    together after a barrier (the first stage ends last; the last stage, done early, would
    show a smaller bubble on its own clock); the measured bubble is 1 - busy / wall, averaged
    over ranks, median over steps. Theory: GPipe and 1F1B
    (p - 1) / (m + p - 1), interleaved 1F1B with v stages per rank (p - 1) / (v m + p - 1).
    Three kinds of stage compute:
      - ``wait``: each stage's forward waits t_f and its backward 2 t_f (a custom autograd
        function around ``time.sleep``, per rank per micro-batch t_f = 20 ms in total, split
        over the v local stages): an accelerator's kernels as the host sees them. It uses no
        CPU, so p = 4 ranks on 2 cores measure the schedule itself, free of core contention;
      - ``matmul``: each rank's stage is a stack of 16 Linear(1024, 1024) + tanh on 32-row
        micro-batches (~15 ms forward on one thread): real CPU work, clean only at p = 2 on 2
        idle cores (with 4 processes on 2 cores the ranks' compute time-shares the cores and
        the "bubble" measures contention, so p = 4 is not run with matmuls);
      - ``gpt``: our ``Trainer`` with ``pipeline_parallel = 2`` (``parallel/pipeline.py``,
        the same torch schedules) on a small GPT (4 layers, hidden 256, micro-batches of
        4 x 64 tokens): the first stage also embeds and the last applies the head and the
        loss, so the stages are nearly, not exactly, equal; p = 2 only, as matmul.
    The activations sent between stages are 32 x 256 (wait) or 32 x 1024 (matmul) fp32, 32 or
    128 KiB, sub-millisecond over loopback against 15-20 ms of compute; the step and busy times
    and the ideal step (the busy time stretched by the theory's bubble) are printed, so the
    schedule's own overhead shows as step - ideal. Target: measured within 0.05 of theory.

(3) Bytes communicated per step per rank, in the same runs as (1): the bytes each process
    wrote to its sockets during the step (``wchar`` of ``/proc/self/io``, which counts
    ``write``/``writev`` on gloo's TCP pairs; nothing else writes during a step), median
    over steps; and, from one step under ``torch.profiler``, the collectives gloo ran
    (``gloo:*`` events with their tensor sizes) for the breakdown. Theory per rank (fp32,
    Psi parameters, ring collectives: an all-gather or reduce-scatter sends (N - 1)/N of the
    full tensor, an all-reduce twice that): DDP all-reduces the gradients, 2 (N - 1)/N x 4 Psi;
    ZeRO-3 all-gathers the parameters in forward and again in backward and reduce-scatters
    the gradients, 3 (N - 1)/N x 4 Psi; the paper's stages 1 and 2 communicate as DDP. A
    second column counts what this implementation must send on gloo, whose reduce-scatter is
    an all-reduce (measured: ``reduce_scatter_tensor`` of 4 MiB over 2 ranks writes 4 MiB):
    2, 3, 3, 4 x (N - 1)/N x 4 Psi for stages 0, 1, 2, 3 (our ZeRO-1 all-reduces the whole
    gradient, then all-gathers the updated shards). The loss average and the gradient-norm
    all-reduce add a few bytes. Targets: DDP and ZeRO-3 within 10% of the ring theory; every
    stage within 10% of its count on gloo (nothing sent twice).

The machine's load is printed as in bench_train: load averages and the busiest processes
before the run, and the cores other processes kept busy during each part (/proc/stat minus
this process and its children); a warning follows when that exceeded a quarter of a core
(the memory and byte counts do not depend on it; the matmul bubbles do).

Run: ``make bench-parallel`` or ``.venv/bin/python benchmarks/bench_parallel.py [--quick]
[--parts zero,pipeline] [--dp 2,4] [--pp 2,4] [--compute wait,matmul,gpt]``. The default
run takes ~2.5 minutes on 2 idle cores (~4 when they are shared), ``--quick`` ~40 s.
Last run: ``results/bench_parallel.txt``. The GPU throughput of the 350M and 1.3B recipes is
``benchmarks/gpu_throughput.sh`` (needs GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "trainer" / "tests"))  # the distributed harness

from bench_train import machine_report  # noqa: E402
from distributed import run_distributed  # noqa: E402
from machine import OtherLoad, load_average  # noqa: E402

# (1) and (3): the GPT of the ZeRO runs
VOCAB, HIDDEN, LAYERS, HEADS, SEQ, MBS = 2048, 256, 4, 8, 64, 4
ZERO_VARIANTS = {"ZeRO-0 (DDP)": (0, False), "ZeRO-1": (1, False), "ZeRO-2": (2, False),
                 "ZeRO-3": (3, False), "ZeRO-3 + offload": (3, True)}
# (2): per rank per micro-batch forward time of the wait stages; backward is twice that
T_FORWARD = 0.020
MATMUL_WIDTH, MATMUL_ROWS, MATMUL_LAYERS = 1024, 32, 16
WAIT_WIDTH = 256  # activations of the wait stages: 32 x 256 fp32 = 32 KiB
# (2), compute "gpt": our Trainer's pipeline on this GPT (fp32), GPT_MBS samples a micro-batch
GPT_VOCAB, GPT_HIDDEN, GPT_LAYERS, GPT_HEADS, GPT_SEQ, GPT_MBS = 512, 256, 4, 8, 64, 4
FP32 = 4


# ------------------------------------------------------------------------ (1) + (3) ZeRO


def zero_config(dp: int, stage: int, offload: bool):
    from bloomline.trainer.config import Config

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
    return cfg


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
    try:
        from bloomline.trainer.parallel.memory import model_state_bytes
    except ImportError:
        def fallback(model, optimizer) -> dict:
            found = count_fallback(model, optimizer)
            return {**found, **{f"{kind}_host": 0 for kind in list(found)}}
        return fallback, "bench_parallel's fallback counter"

    def count(model, optimizer) -> dict:
        found = model_state_bytes(model, optimizer, "cpu", offload)
        held = {}
        for kind, key in (("params", "params"), ("grads", "grads"), ("optimizer", "optim")):
            held[kind] = found[f"{key}_device"] + found[f"{key}_host"]
            held[f"{kind}_host"] = found[f"{key}_host"]
        return held
    return count, "bloomline.trainer.parallel.memory.model_state_bytes"


def _wchar() -> int:
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


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

    from bloomline.trainer.loop import Trainer

    generator = torch.Generator().manual_seed(0)
    out = {"variants": {}}
    for label, (stage, offload) in variants.items():
        count, out["counter"] = _counter(offload)
        try:
            trainer = Trainer(zero_config(dp, stage, offload), log=lambda *_: None)
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
            before, start = _wchar(), time.perf_counter()
            trainer.train_step([tokens], lr)
            seconds.append(time.perf_counter() - start)
            wire.append(_wchar() - before)
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
    gloo, whose reduce-scatter is an all-reduce (measured: a reduce_scatter_tensor of 4 MiB
    over 2 ranks writes 4 MiB, not 2): ZeRO-1 all-reduces the whole gradient then
    all-gathers the updated shards; FSDP2 (ZeRO-2/3) reduce-scatters the gradients and
    all-gathers the parameters once (ZeRO-2) or in forward and again in backward (ZeRO-3)."""
    params = FP32 * numel / (dp if stage >= 3 else 1)
    grads = FP32 * numel / (dp if stage >= 2 else 1)
    optimizer = 2 * FP32 * numel / (dp if stage >= 1 else 1)
    ring = (dp - 1) / dp * FP32 * numel  # one all-gather or reduce-scatter of the model
    gloo = {0: 2, 1: 3, 2: 3, 3: 4}[stage] * ring
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "wire": 3 * ring if stage == 3 else 2 * ring, "gloo": gloo, "offload": offload}


def measure_zero(args) -> dict:
    results = {}
    for dp in args.dp:
        print(f"ZeRO: {len(ZERO_VARIANTS)} variants at dp = {dp} ...", flush=True)
        load = OtherLoad().start()
        ranks = run_distributed(dp, zero_worker, dp, ZERO_VARIANTS, args.zero_steps)
        results[dp] = {"ranks": ranks, "other": load.cores()}
        print(f"ZeRO dp = {dp}: done; other processes {results[dp]['other']:.2f} cores",
              flush=True)
    return results


# ----------------------------------------------------------------------- (2) pipeline


class _Wait(torch.autograd.Function):
    """Identity whose forward takes ``forward_s`` and backward ``backward_s`` of wall time
    without using the CPU (an accelerator kernel as the host sees it)."""

    @staticmethod
    def forward(ctx, x, forward_s: float, backward_s: float):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class WaitStage(torch.nn.Module):
    def __init__(self, width: int, forward_s: float) -> None:
        super().__init__()
        # a parameter, so that the first stage's output has a gradient to send back; an
        # elementwise scale keeps the CPU work negligible next to the waits
        self.scale = torch.nn.Parameter(torch.ones(width))
        self.forward_s = forward_s

    def forward(self, x):
        return _Wait.apply(x * self.scale, self.forward_s, 2 * self.forward_s)


class MatmulStage(torch.nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _timed(stage, busy: list) -> None:
    """Add the wall time of every compute action of ``stage`` to ``busy[0]``."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        method = getattr(stage, name, None)
        if method is None:
            continue

        def timed(*args, method=method, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                busy[0] += time.perf_counter() - start
        setattr(stage, name, timed)


def _pipeline_loss(output, target):
    return output.mean() * 0 + (output * target).mean()


def build_pipeline(p: int, rank: int, schedule: str, m: int, v: int, compute: str):
    """This rank's stages (v of them for interleaved, stage indices rank + k p) and the
    schedule; returns (schedule, has_first, has_last, busy counter)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    local = v if schedule == "interleaved" else 1
    num_stages = p * local
    width = WAIT_WIDTH if compute == "wait" else MATMUL_WIDTH
    stages, busy = [], [0.0]
    for k in range(local):
        index = rank + k * p
        torch.manual_seed(index)
        module = (WaitStage(width, T_FORWARD / local) if compute == "wait"
                  else MatmulStage(width, MATMUL_LAYERS // local))
        # shapes inferred from the first (warm-up) step
        stage = PipelineStage(module, index, num_stages, torch.device("cpu"))
        _timed(stage, busy)
        stages.append(stage)
    if schedule == "interleaved":
        runner = ScheduleInterleaved1F1B(stages, m, loss_fn=_pipeline_loss)
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        runner = cls(stages[0], m, loss_fn=_pipeline_loss)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    return runner, has_first, has_last, busy


class _TrainerPipeline:
    """Our ``Trainer`` with ``pipeline_parallel = p`` on the GPT below: the stages and
    schedules its pipeline module built, timed the same way (after the warm-up step, which
    builds them), the wall time being that of the schedule's ``step``."""

    def __init__(self, p: int, schedule: str, m: int, v: int) -> None:
        from bloomline.trainer.loop import Trainer

        cfg = zero_config(1, 0, False)
        model = cfg.model
        model.vocab_size, model.hidden_size, model.num_layers, model.num_heads = (
            GPT_VOCAB, GPT_HIDDEN, GPT_LAYERS, GPT_HEADS)
        cfg.data.seq_length = GPT_SEQ
        cfg.train.micro_batch_size, cfg.train.global_batch_size = GPT_MBS, GPT_MBS * m
        par = cfg.parallel
        par.pipeline_parallel, par.pipeline_schedule = p, schedule
        par.pipeline_microbatches, par.virtual_stages = m, v
        self.trainer = Trainer(cfg, log=lambda *_: None)
        generator = torch.Generator().manual_seed(0)
        self.micro = [torch.randint(0, GPT_VOCAB, (GPT_MBS, GPT_SEQ + 1), generator=generator)
                      for _ in range(m)]
        self.busy, self.wall, self.timed = [0.0], [0.0], False

    def _time_schedules(self) -> None:
        for built in self.trainer.pipeline._schedules.values():  # made by the first step
            # (a private cache: the schedule, or a tuple starting with it)
            runner = built[0] if isinstance(built, tuple) else built
            stages = getattr(runner, "_stages", None) or [runner._stage]
            for stage in stages:
                _timed(stage, self.busy)
            step = runner.step

            def timed_step(*args, step=step, **kwargs):
                start = time.perf_counter()
                try:
                    return step(*args, **kwargs)
                finally:
                    self.wall[0] += time.perf_counter() - start
            runner.step = timed_step
        self.timed = True

    def run(self) -> tuple[float, float]:
        import torch.distributed as dist

        dist.barrier()
        self.busy[0] = self.wall[0] = 0.0
        self.trainer.train_step(self.micro, 1e-3)
        if not self.timed:
            self._time_schedules()
        return self.busy[0], self.wall[0]


class _TorchPipeline:
    """torch.distributed.pipelining on the synthetic stages."""

    def __init__(self, p: int, rank: int, schedule: str, m: int, v: int, compute: str) -> None:
        self.runner, self.has_first, self.has_last, self.busy = build_pipeline(
            p, rank, schedule, m, v, compute)
        width = WAIT_WIDTH if compute == "wait" else MATMUL_WIDTH
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(m * MATMUL_ROWS, width, generator=generator)
        self.target = torch.randn(m * MATMUL_ROWS, width, generator=generator)

    def run(self) -> tuple[float, float]:
        import torch.distributed as dist

        dist.barrier()
        self.busy[0] = 0.0
        start = time.perf_counter()
        args = (self.x,) if self.has_first else ()
        self.runner.step(*args, target=self.target if self.has_last else None)
        return self.busy[0], time.perf_counter() - start


def pipeline_worker(p: int, configs: list, rounds: int, steps: int) -> dict:
    """On every rank: per config (schedule, m, v, compute), the (busy, wall) of each step."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    built, errors = {}, {}
    for config in configs:
        schedule, m, v, compute = config
        try:
            built[config] = (_TrainerPipeline(p, schedule, m, v) if compute == "gpt"
                             else _TorchPipeline(p, rank, schedule, m, v, compute))
            built[config].run()  # warm-up: shapes, buffers, the first allocations
        except Exception as error:  # noqa: BLE001 - reported, skipped (the same on all ranks)
            built.pop(config, None)
            errors[config] = f"{type(error).__name__}: {error}"[:300]
    samples: dict = {config: [] for config in built}
    order = list(built)
    for round_no in range(rounds):
        for config in (order if round_no % 2 == 0 else order[::-1]):
            for _ in range(steps):
                samples[config].append(built[config].run())
    return {"samples": samples, "errors": errors}


def pipeline_configs(p: int, compute: str, quick: bool) -> list:
    counts = [p, 2 * p, 4 * p] if quick or p > 2 else [p, 2 * p, 4 * p, 8 * p]
    configs = [(schedule, m, 1, compute) for schedule in ("gpipe", "1f1b") for m in counts]
    configs += [("interleaved", m, 2, compute) for m in counts]
    return configs


def measure_pipeline(args) -> dict:
    results = {}
    for p in args.pp:
        kinds = [k for k in args.compute if k == "wait" or p <= 2]  # CPU work: p <= 2 only
        configs = [c for kind in kinds for c in pipeline_configs(p, kind, args.quick)]
        print(f"pipeline: {len(configs)} configurations on p = {p} ranks ...", flush=True)
        load = OtherLoad().start()
        ranks = run_distributed(p, pipeline_worker, p, configs, args.pipe_rounds,
                                args.pipe_steps)
        results[p] = {"ranks": ranks, "other": load.cores()}
        print(f"pipeline p = {p}: done; other processes {results[p]['other']:.2f} cores",
              flush=True)
    return results


def pipeline_ours() -> str:
    try:
        from bloomline.trainer.parallel import pipeline  # noqa: F401
    except ImportError:
        return "bloomline.trainer.parallel.pipeline is not there: no gpt rows"
    return ("bloomline.trainer.parallel.pipeline runs the same torch schedules "
            "(PipelineStage per stage, scale_grads=False)")


# ---------------------------------------------------------------------------- reporting


def _mib(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value / 2**20:>9.2f}"


def _zero_rows(results: dict):
    """(dp, label, stage, offload, per-rank results or None, error) in table order."""
    for dp, res in results.items():
        for label, (stage, offload) in ZERO_VARIANTS.items():
            found = [r["variants"][label] for r in res["ranks"]]
            yield dp, label, stage, offload, (None if "error" in found[0] else found), \
                found[0].get("error")


def report_zero(results: dict, targets: list, notes: list) -> None:
    header = (f"{'layout':<18} {'dp':>3} {'params':>9} {'peak fw':>9} {'grads':>9} "
              f"{'optim':>9} {'on host':>9} {'states':>9} {'formula':>9} {'ratio':>6} "
              f"{'peak':>9} {'ratio':>6}")
    print()
    print("(1) model states per rank (MiB, the max over ranks)")
    print(header)
    print("-" * len(header))
    for dp, label, stage, offload, found, error in _zero_rows(results):
        if found is None:
            print(f"{label:<18} {dp:>3}  skipped: {error}")
            continue

        def top(key, found=found):
            return max(f[key] for f in found)
        theory = zero_theory(stage, offload, found[0]["numel"], dp)
        formula = theory["params"] + theory["grads"] + theory["optimizer"]
        states = max(f["params_rest"] + f["grads"] + f["optimizer"] for f in found)
        peak = max(f["params_peak"] + f["grads"] + f["optimizer"] for f in found)
        print(f"{label:<18} {dp:>3} {_mib(top('params_rest'))} {_mib(top('params_peak'))} "
              f"{_mib(top('grads'))} {_mib(top('optimizer'))} {_mib(top('host'))} "
              f"{_mib(states)} {_mib(formula)} {states / formula:>6.2f} {_mib(peak)} "
              f"{peak / formula:>6.2f}")
        ok = states <= 1.05 * formula
        targets.append(f"target: {label} dp {dp} model states <= 1.05x the ZeRO formula: "
                       f"{states / formula:.2f}x {'PASS' if ok else 'FAIL'}")
    numel = next((f[0]["numel"] for *_, f, _ in _zero_rows(results) if f), 0)
    counter = next((f[0].get("counter") for *_, f, _ in _zero_rows(results) if f), None)
    counter = counter or next(r["counter"] for res in results.values() for r in res["ranks"])
    print(f"model: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, vocabulary {VOCAB}: Psi = "
          f"{numel:,} parameters ({FP32 * numel / 2**20:.2f} MiB fp32), fp32 training with "
          f"AdamW; counts by {counter}. params: at rest (just before optimizer.step); peak fw: "
          "allocated parameter storages when the last block starts its forward (the resting "
          "ones plus the gathered copies registered in their place); grads: at "
          "optimizer.step; optim: after it (m and v; scalars not counted); on host: what "
          "memory.py counts as host memory (on a CPU-only run it goes by parallel.offload: "
          "host and device are the same memory here); states = params + grads + optim; "
          "formula: the ZeRO paper's 4 + 4 + 8 bytes per parameter, divided by dp where the "
          "stage shards it; peak = peak fw + grads + optim (an upper bound of the step's "
          "model states).")


def report_bytes(results: dict, targets: list, notes: list) -> None:
    header = (f"{'layout':<18} {'dp':>3} {'sent':>9} {'theory':>9} {'ratio':>6} "
              f"{'on gloo':>9} {'ratio':>6} {'step s':>7}  collectives (calls x MiB)")
    print()
    print("(3) bytes sent per step per rank (MiB, the max over ranks)")
    print(header)
    print("-" * len(header))
    for dp, label, stage, offload, found, error in _zero_rows(results):
        if found is None:
            print(f"{label:<18} {dp:>3}  skipped: {error}")
            continue
        theory = zero_theory(stage, offload, found[0]["numel"], dp)
        wire = max(f["wire"] for f in found)
        calls = ", ".join(f"{name} {len(sizes)} x {sum(sizes) * FP32 / 2**20 / len(sizes):.2f}"
                          for name, sizes in sorted(found[0]["collectives"].items()))
        print(f"{label:<18} {dp:>3} {_mib(wire)} {_mib(theory['wire'])} "
              f"{wire / theory['wire']:>6.2f} {_mib(theory['gloo'])} "
              f"{wire / theory['gloo']:>6.2f} "
              f"{statistics.median(f['seconds'] for f in found):>7.3f}  {calls or 'none'}")
        if stage in (0, 3) and not offload:
            gain = wire / theory["wire"]
            targets.append(f"target: {label} dp {dp} bytes sent within 10% of the ring "
                           f"theory: {gain:.2f}x {'PASS' if abs(gain - 1) <= 0.10 else 'FAIL'}")
        gain = wire / theory["gloo"]
        targets.append(f"target: {label} dp {dp} bytes sent within 10% of this "
                       f"implementation's count on gloo: {gain:.2f}x "
                       f"{'PASS' if abs(gain - 1) <= 0.10 else 'FAIL'}")
    print(f"micro-batch {MBS} x L {SEQ} per rank per step (one micro-batch: the formulas are "
          "per forward/backward). sent: bytes the process wrote to its sockets during a step "
          "(wchar of /proc/self/io, median over steps); theory: the paper's, with ring "
          "collectives: 2(N-1)/N x 4 Psi (stages 0-2), 3(N-1)/N x 4 Psi (stage 3); on gloo: "
          "what this implementation must send on gloo, where a reduce-scatter costs an "
          "all-reduce: 2, 3, 3, 4 x (N-1)/N x 4 Psi for stages 0, 1, 2, 3 (ZeRO-1 all-reduces "
          "the whole gradient, then all-gathers the updated shards); collectives: gloo's, "
          "from one profiled step on rank 0, with the mean MiB of their first input (FSDP2's "
          "reduce-scatters appear as all_reduce).")
    for dp, res in results.items():
        notes.append(f"ZeRO dp {dp}: other processes {res['other']:.2f} cores during the runs")


def report_pipeline(results: dict, targets: list, notes: list) -> None:
    header = (f"{'schedule':<12} {'compute':<7} {'p':>2} {'v':>2} {'m':>3} {'bubble':>7} "
              f"{'theory':>7} {'diff':>6} {'step ms':>8} {'busy ms':>8} {'ideal ms':>9} "
              f"{'extra/action ms':>15}")
    print()
    print("(2) pipeline bubble: 1 - busy / step wall per rank, mean over ranks, median over "
          "steps")
    print(header)
    print("-" * len(header))
    for p, res in results.items():
        ranks = res["ranks"]
        for config, err in ranks[0]["errors"].items():
            notes.append(f"pipeline p {p} {config}: skipped: {err}")
        for config in ranks[0]["samples"]:
            schedule, m, v, compute = config
            per_step = list(zip(*(r["samples"][config] for r in ranks), strict=True))
            # the step ends when its last rank ends (the ranks start together after a barrier)
            walls = [max(wall for _, wall in step) for step in per_step]
            bubbles = [statistics.mean(1 - busy / wall for busy, _ in step)
                       for step, wall in zip(per_step, walls, strict=True)]
            busies = [statistics.mean(busy for busy, _ in step) for step in per_step]
            bubble = statistics.median(bubbles)
            theory = (p - 1) / (v * m + p - 1)
            busy = statistics.median(busies)
            # a perfect schedule: the busy time plus the fill and drain at this busy time
            ideal = busy * (v * m + p - 1) / (v * m)
            diff = bubble - theory
            print(f"{schedule:<12} {compute:<7} {p:>2} {v:>2} {m:>3} {bubble:>7.3f} "
                  f"{theory:>7.3f} {diff:>+6.3f} {1e3 * statistics.median(walls):>8.1f} "
                  f"{1e3 * busy:>8.1f} {1e3 * ideal:>9.1f} "
                  f"{1e3 * (statistics.median(walls) - ideal) / (2 * v * m):>15.2f}")
            targets.append(f"target: {schedule} {compute} p {p} m {m} bubble within 0.05 of "
                           f"theory: {diff:+.3f} {'PASS' if abs(diff) <= 0.05 else 'FAIL'}")
        notes.append(f"pipeline p {p}: other processes {res['other']:.2f} cores during the runs")
    print(f"theory: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v m+p-1) for interleaved; ideal: "
          f"the busy time stretched by that bubble; extra/action: (step - ideal) over the 2 v m "
          f"compute actions of a rank, the schedule's own cost per action (its bookkeeping, "
          f"the sends and receives, the loss). wait: forward {1e3 * T_FORWARD:.0f} ms + "
          f"backward {2e3 * T_FORWARD:.0f} ms per rank per micro-batch, slept; matmul: "
          f"{MATMUL_LAYERS} x Linear({MATMUL_WIDTH}, {MATMUL_WIDTH}) + tanh per rank on "
          f"{MATMUL_ROWS}-row micro-batches, one thread per rank; gpt: our Trainer "
          f"(pipeline_parallel = p, fp32) on a GPT of {GPT_LAYERS} layers, hidden {GPT_HIDDEN}, "
          f"vocabulary {GPT_VOCAB}, micro-batches of {GPT_MBS} x L {GPT_SEQ} (the first stage "
          "also embeds, the last applies the head and the loss: not quite identical stages). "
          f"{pipeline_ours()}.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="zero,pipeline")
    parser.add_argument("--dp", default="2,4", help="data-parallel sizes of the ZeRO part")
    parser.add_argument("--pp", default="2,4", help="pipeline sizes of the bubble part")
    parser.add_argument("--compute", default="wait,matmul,gpt",
                        help="stage compute kinds (gpt: our Trainer's pipeline)")
    parser.add_argument("--zero-steps", type=int, default=3, help="measured steps per variant")
    parser.add_argument("--pipe-rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--pipe-steps", type=int, default=1, help="steps per config per round")
    parser.add_argument("--quick", action="store_true",
                        help="dp 2 and p 2 only, fewer micro-batch counts, 1 round")
    args = parser.parse_args()
    args.dp = [int(v) for v in args.dp.split(",")]
    args.pp = [int(v) for v in args.pp.split(",")]
    args.compute = args.compute.split(",")
    if args.quick:
        args.dp, args.pp, args.zero_steps, args.pipe_rounds = [2], [2], 2, 1
    parts = set(args.parts.split(","))
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # the spawned ranks too
    print(machine_report("gloo"), flush=True)
    targets: list[str] = []
    notes: list[str] = []
    others = []
    zero = measure_zero(args) if "zero" in parts else {}
    pipe = measure_pipeline(args) if "pipeline" in parts else {}
    if zero:
        report_zero(zero, targets, notes)
        report_bytes(zero, targets, notes)
        others += [r["other"] for r in zero.values()]
    if pipe:
        report_pipeline(pipe, targets, notes)
        others += [r["other"] for r in pipe.values()]
    for note in notes:
        print(note)
    if others and max(others) > 0.25:
        print(f"warning: other processes took up to {max(others):.2f} cores during a part: the "
              "matmul bubbles and step times are noisier than usual (the byte counts and the "
              "wait bubbles are not affected); rerun when idle")
    print(load_average("after"))
    for line in targets:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
