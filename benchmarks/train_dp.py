"""The ZeRO engines' rows of ``benchmarks.train`` ((c) of its docstring): ours at dp 2 on the
buffers engine (``parallel.zero_engine = "buffers"``, Megatron's distributed optimizer) beside
FSDP2's (``"fsdp2"``), ZeRO-1 and ZeRO-2, in each precision the step rounds ran.

The ranks: ``run_distributed`` (``--dp`` gloo processes of one torch thread each: the 2 cores
the single-process rows use with 2 threads), each rank a micro-batch of ``MBS`` x ``SEQ`` per
step. All four cases of a precision are built in the same ranks and stepped in the same
interleaved rounds (``--rounds`` x ``--steps`` after ``--warmup``;
``benchmarks/parallel_engines.py``, also ``benchmarks.parallel``'s part (4)). The table's row per
stage and precision: buffers' tokens/s (both ranks' tokens) against fsdp2's, the ratio the
median of per-round ratios, the limit the precision's single-process one (the matmul peak on 2
threads over the FLOPs per token: the same 2 cores). A second table has, per case, the step
time, the collective calls per step (counted on rank 0 by wrapping the ``torch.distributed``
and functional-collective functions; gloo's own count from a profiled step beside it), the
bytes sent against what the engine must send on gloo, the model states and the step's peak.
"""

from __future__ import annotations

import functools

import torch

from benchmarks.harness.machine import OtherLoad, descendants_cpu_seconds
from benchmarks.harness.stats import ratio
from benchmarks.harness.train_setup import DTYPES, MBS, SEQ, dp_engine_setup
from benchmarks.parallel_engines import (
    engine_cases,
    engine_summary,
    engines_worker,
    print_engine_table,
)
from bloomline.trainer.parallel.local_processes import run_distributed
from bloomline.trainer.reporting.mfu import measure_peak_flops

__all__ = ["dp_rows", "dp_table", "measure_dp_engines"]


def measure_dp_engines(args, precisions: list[str], results: dict) -> dict:
    """The engines at dp ``args.dp`` (module docstring, (c)): ``{"summary", "peaks",
    "other"}``; the matmul peak per precision is the step rounds' highest (measured here when
    the precision's rounds did not run)."""
    cases = engine_cases(precisions)
    print(f"dp {args.dp}: ZeRO-1/2 on the buffers and fsdp2 engines, {len(cases)} cases ...",
          flush=True)
    load = OtherLoad(descendants_cpu_seconds).start()
    setup = functools.partial(dp_engine_setup, tune_malloc=args.tune_malloc)
    ranks = run_distributed(args.dp, engines_worker, setup, args.dp, cases, args.rounds,
                            args.steps, args.warmup)
    other = load.cores()
    peaks = {precision: (max(results[precision]["peaks"]) if precision in results else
                         measure_peak_flops(torch.device("cpu"), DTYPES[precision]))
             for precision in precisions}
    summary = engine_summary(ranks, args.dp)
    for (stage, engine, precision, _), found in summary.items():
        if "step" in found:
            print(f"dp {args.dp} ZeRO-{stage} {precision} {engine}: "
                  f"{args.dp * MBS * SEQ / found['step']:,.0f} tokens/s", flush=True)
    print(f"dp {args.dp}: done; other processes {other:.2f} cores", flush=True)
    return {"summary": summary, "peaks": peaks, "other": other, "dp": args.dp}


def dp_rows(dp_engines: dict, flops: float, rows: list, notes: list) -> None:
    """A row of the main table per ZeRO stage and precision: buffers' tokens/s against
    fsdp2's."""
    dp, summary = dp_engines["dp"], dp_engines["summary"]
    tokens = dp * MBS * SEQ
    for (stage, engine, precision, mb), found in summary.items():
        base = summary.get((stage, "fsdp2", precision, mb), {})
        if engine == "fsdp2":
            continue
        label = f"train step {precision} dp{dp} ZeRO-{stage}, buffers vs fsdp2, tokens/s"
        if "error" in found or "error" in base:
            notes.append(f"{label}: not measured: {found.get('error') or base.get('error')}")
            continue
        limit = dp_engines["peaks"][precision] / flops
        rate = tokens * mb / found["step"]
        rows.append((label, rate, tokens * mb / base["step"],
                     ratio([1 / r for r in found["rounds"]], [1 / r for r in base["rounds"]]),
                     limit, rate / limit))


def dp_table(dp_engines: dict, notes: list) -> None:
    """The engines' table: per case the step, the collectives, the bytes and the memory."""
    dp, summary = dp_engines["dp"], dp_engines["summary"]
    tokens = dp * MBS * SEQ
    print_engine_table(f"ZeRO-1/2 engines at dp {dp}: buffers beside fsdp2, same ranks, "
                       "interleaved rounds", {dp: summary}, notes, tokens_per_step=tokens)
    print(f"dp {dp}: {dp} gloo processes of one torch thread; micro-batch {MBS} x L {SEQ} per "
          "rank; step ms: the median over the rounds' steps of the slowest rank's train_step; "
          "tok/s: both ranks' tokens per step over it; vs fsdp2: the median of per-round "
          "ratios; calls: collective calls per step on rank 0 (wrapped torch.distributed and "
          "functional-collective functions); gloo ops: what gloo ran in a profiled step (the "
          "cross-check); sent MiB: written to sockets per step (max over ranks) against what "
          "the engine must send on gloo (benchmarks.parallel_engines.engine_theory); states: "
          "model states at the optimizer step, MiB; peak: held at the step's start + the most "
          "torch allocated during it, MiB; loss: rank 0's after the last step; collectives: "
          "calls x mean MiB of the whole tensor.")
    notes.append(f"dp {dp}: other processes {dp_engines['other']:.2f} cores during the "
                 f"engines' rounds; limit: the precision's matmul peak (2 threads, as the "
                 f"{dp} ranks' 2 cores) / FLOPs per token")
