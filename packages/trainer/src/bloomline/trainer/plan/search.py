"""`trainer plan --search`: the layouts of a model on N GPUs that fit, ranked by the time model.

Enumerated: tp among the divisors of the GPUs per node that divide the heads (tp stays inside
a node: its collectives run on every layer); pp from 1 to the layers, where tp x pp divides
the world; dp the rest; ZeRO stage 0-3; micro-batch 1, 2, 4, 8 where dp x micro-batch divides
the global batch; activation recomputation none or full (and selective where the attention
keeps its scores: with a fused kernel, selective recomputes nothing); sequence parallelism on
and off where tp > 1. Each is judged by the closed forms (``memory_formulas.rank_memory`` on
its worst stage, ``time_model.step_time``), not built: thousands of layouts in a second. A
layout fits when its worst stage takes at most ``MEMORY_SHARE`` of the device, the rest being
left to what the formulas leave out (allocator fragmentation, communication buffers, the CUDA
context).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from bloomline.trainer.plan.devices import Device
from bloomline.trainer.plan.memory_formulas import Layout, rank_memory
from bloomline.trainer.plan.time_model import StepTime, step_time

__all__ = ["MEMORY_SHARE", "Candidate", "SearchResult", "describe", "format_search", "search"]

MEMORY_SHARE = 0.9
MICRO_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Candidate:
    """One layout that fits: its worst stage's bytes and its predicted step."""

    layout: Layout
    worst_stage: int
    memory_bytes: float
    time: StepTime


@dataclass(frozen=True)
class SearchResult:
    """Fitting layouts, fastest first; how many layouts were dropped and why; where the
    given layout ranks among the fitting ones (None when it does not fit, or is not among
    the enumerated layouts)."""

    ranked: list[Candidate]
    dropped: Counter
    given_rank: int | None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _same_choice(a: Layout, b: Layout) -> bool:
    keys = ("tp", "pp", "dp", "zero_stage", "micro_batch", "recompute", "sequence_parallel")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _layouts(base: Layout, world: int, gpus_per_node: int, dropped: Counter):
    recomputes = ["none", "full"] + (["selective"] if base.stores_attention_scores else [])
    for tp in _divisors(gpus_per_node):
        if base.heads % tp:
            dropped["tp does not divide the heads"] += 1
            continue
        for pp in range(1, base.layers + 1):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            for mb in MICRO_BATCHES:
                if base.global_batch % (dp * mb):
                    dropped["dp x micro-batch does not divide the global batch"] += 1
                    continue
                for zero in range(4):
                    for recompute in recomputes:
                        for sp in ((False, True) if tp > 1 else (False,)):
                            yield replace(base, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                          zero_stage=zero, recompute=recompute,
                                          sequence_parallel=sp)


def search(base: Layout, world: int, device: Device) -> SearchResult:
    """Every enumerated layout of ``base``'s model on ``world`` GPUs of ``device`` (see the
    module docstring), the fitting ones ranked by predicted tokens/s."""
    dropped: Counter = Counter()
    fitting: list[Candidate] = []
    limit = MEMORY_SHARE * device.memory_bytes
    for layout in _layouts(base, world, device.gpus_per_node, dropped):
        totals = [rank_memory(layout, stage)["total"] for stage in range(layout.pp)]
        worst = max(range(layout.pp), key=totals.__getitem__)
        if totals[worst] > limit:
            dropped["does not fit the device memory"] += 1
            continue
        fitting.append(Candidate(layout, worst, totals[worst], step_time(layout, device)))
    fitting.sort(key=lambda c: -c.time.tokens_per_s)
    given = next((i + 1 for i, c in enumerate(fitting) if _same_choice(c.layout, base)), None)
    return SearchResult(fitting, dropped, given)


def describe(layout: Layout) -> str:
    """A layout in the config's terms."""
    return (f"tp{layout.tp} pp{layout.pp} dp{layout.dp} ZeRO-{layout.zero_stage} "
            f"micro-batch {layout.micro_batch} recompute {layout.recompute}"
            + (" sp" if layout.sequence_parallel else ""))


def format_search(result: SearchResult, base: Layout, world: int, device: Device,
                  top: int = 5) -> str:
    """The top ``top`` layouts with memory and speed, the dropped counts, and where ``base``
    ranks."""
    gib = 2 ** 30
    lines = [f"layouts of this model on {world} x {device.name} that fit "
             f"{MEMORY_SHARE:.0%} of {device.memory_bytes / gib:.0f} GiB: {len(result.ranked)}"
             ", fastest first (time model)"]
    for i, c in enumerate(result.ranked[:top], 1):
        lines.append(f"{i:>3}. {describe(c.layout):<58} {c.memory_bytes / gib:6.1f} GiB "
                     f"(stage {c.worst_stage})  step {c.time.step:8.1f} s  "
                     f"{c.time.tflops_per_gpu:5.0f} TFLOP/s/GPU  MFU {100 * c.time.mfu:4.1f}%")
    for reason, count in sorted(result.dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"dropped {count:,}: {reason}")
    where = (f"ranks {result.given_rank} of {len(result.ranked)}" if result.given_rank
             else "does not fit, or is not among the enumerated layouts")
    lines.append(f"the recipe's layout ({describe(base)}) {where}")
    return "\n".join(lines)
