"""The pipeline part of ``benchmarks.parallel``, the code each rank runs: stages that wait
(an accelerator's kernels as the host sees them), stacks of matmuls, or our ``Trainer``'s
pipeline on a small GPT, under torch's schedules, each stage's busy time recorded.

Contract: ``pipeline_worker(p, configs, rounds, steps)`` runs on every rank of
``run_distributed`` and returns, per (schedule, m, v, compute) config, the (busy, wall) seconds
of each step, and the configs that failed to build with their error.
"""

from __future__ import annotations

import time

import torch

from benchmarks.parallel_zero import zero_config
from bloomline.trainer.loop import Trainer

__all__ = ["GPT_HEADS", "GPT_HIDDEN", "GPT_LAYERS", "GPT_MBS", "GPT_SEQ", "GPT_VOCAB",
           "MATMUL_LAYERS", "MATMUL_ROWS", "MATMUL_WIDTH", "T_FORWARD", "WAIT_WIDTH",
           "pipeline_configs", "pipeline_ours", "pipeline_worker"]

# (2): per rank per micro-batch forward time of the wait stages; backward is twice that
T_FORWARD = 0.020
MATMUL_WIDTH, MATMUL_ROWS, MATMUL_LAYERS = 1024, 32, 16
WAIT_WIDTH = 256  # activations of the wait stages: 32 x 256 fp32 = 32 KiB
# (2), compute "gpt": our Trainer's pipeline on this GPT (fp32), GPT_MBS samples a micro-batch
GPT_VOCAB, GPT_HIDDEN, GPT_LAYERS, GPT_HEADS, GPT_SEQ, GPT_MBS = 512, 256, 4, 8, 64, 4


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
        for built in self.trainer.runner.stages._schedules.values():  # made by the first step
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


def pipeline_ours() -> str:
    try:  # optional: a tree without the trainer's pipeline gets no gpt rows
        from bloomline.trainer.parallel import pipeline  # noqa: F401
    except ImportError:
        return "bloomline.trainer.parallel.pipeline is not there: no gpt rows"
    return ("bloomline.trainer.parallel.pipeline runs the same torch schedules "
            "(PipelineStage per stage, scale_grads=False)")
