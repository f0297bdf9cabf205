"""What the parallel layouts cost per rank, measured on CPU (gloo), against the theory each
one is sold by: ZeRO memory, pipeline bubbles, data-parallel communication.

Every part runs its ranks as real processes (``bloomline.trainer.parallel.local_processes``:
torchrun's environment, gloo, one torch thread per process) on this machine's cores.

(1) ZeRO memory per rank. ``Trainer`` (the GPT below, fp32 with AdamW, one micro-batch of
    ``MBS`` samples per rank per step) with ``parallel.zero_stage`` 0 (DDP), 1 and 2 on both
    engines (``parallel.zero_engine`` fsdp2 and buffers, named in the row), 3 and 3 +
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
        micro-batches: real CPU work, clean only at p = 2 on 2 idle cores (with 4
        processes on 2 cores the ranks' compute time-shares the cores and
        the "bubble" measures contention, so p = 4 is not run with matmuls);
      - ``gpt``: our ``Trainer`` with ``pipeline_parallel = 2`` (``parallel/pipeline.py``,
        the same torch schedules) on a small GPT (4 layers, hidden 256, micro-batches of
        4 x 64 tokens): the first stage also embeds and the last applies the head and the
        loss, so the stages are nearly, not exactly, equal; p = 2 only, as matmul.
    The activations sent between stages are 32 x 256 (wait) or 32 x 1024 (matmul) fp32, 32 or
    128 KiB, small against a stage's compute (``benchmarks/results/parallel.md``); the step and
    busy times and the ideal step (the busy time stretched by the theory's bubble) are printed, so
    the schedule's own overhead shows as step - ideal. Target: measured within 0.05 of theory.

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
    an all-reduce (it writes the whole tensor, not (N - 1)/N of it;
    ``benchmarks/results/parallel.md``): 2, 3, 3, 4 x (N - 1)/N x 4 Psi for stages 0, 1, 2, 3
    (fsdp2's ZeRO-1 all-reduces the whole gradient, then all-gathers the updated shards; the
    buffers engine reduce-scatters its fp32 gradient buckets, then all-gathers the updated
    rows, in fp32 here: the same count on gloo at both stages). The loss average
    and the gradient-norm all-reduce add a few bytes. Targets: DDP and ZeRO-3 within 10% of the
    ring theory; every stage within 10% of its count on gloo (nothing sent twice).

(4) The ZeRO-1/2 engines side by side (``benchmarks/parallel_engines.py``): the buffers engine
    (``parallel.zero_engine = "buffers"``: Megatron's distributed optimizer, fp32 gradient
    buckets, one reduce-scatter and one all-gather per bucket) against FSDP2's
    (``zero_engine = "fsdp2"``), ZeRO-1 and ZeRO-2, on the GPT of (1), at each dp of
    ``--engine-dp``, in fp32 and bf16 (skipped where the CPU has no fast bf16 path), with 1 and
    4 micro-batches per step. One ``Trainer`` per case, all built in the same ranks and
    stepped in interleaved rounds. Per case: the step time (median over the measured steps of
    the slowest rank's ``train_step``) and its ratio to FSDP2's (median of per-round ratios);
    the collective calls per step, counted on rank 0 by wrapping the ``torch.distributed`` and
    functional-collective functions both engines call (``harness/collectives.py``), with the
    calls gloo itself ran in a profiled step as the cross-check; the bytes sent per step
    (``wchar``, as (3)) against what the engine must send on gloo
    (``parallel_engines.engine_theory``); the model states at the optimizer step (as (1)) and
    the peak of the step (what the case held when the step began plus the most torch
    allocated during it, from the profiler's memory events); the loss after the last step.

The machine's load is printed as in ``benchmarks.train``: load averages and the busiest processes
before the run, and the cores other processes kept busy during each part (/proc/stat minus
this process and its descendants: the ranks are forked by a live forkserver); a warning
follows when that exceeded a quarter of a core (the memory and byte counts do not depend on
it; the matmul bubbles do).

Run: ``make bench-parallel`` or ``python -m benchmarks.parallel [--quick]
[--parts zero,pipeline,engines] [--dp 2,4] [--pp 2,4] [--compute wait,matmul,gpt]
[--engine-dp 2] [--engine-precisions fp32,bf16] [--engine-micro-batches 1,4]``. Run time and
last result: ``benchmarks/results/parallel.md``, ``results/bench_parallel.txt``. The GPU throughput
of the 350M and 1.3B recipes is ``benchmarks/gpu_throughput.sh`` (needs GPUs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import warnings

from benchmarks.harness.machine import (
    OtherLoad,
    descendants_cpu_seconds,
    load_average,
    machine_report,
)
from benchmarks.parallel_engines import (
    engine_cases,
    engine_summary,
    engines_worker,
    print_engine_table,
)
from benchmarks.parallel_pipeline import (
    GPT_HIDDEN,
    GPT_LAYERS,
    GPT_MBS,
    GPT_SEQ,
    GPT_VOCAB,
    MATMUL_LAYERS,
    MATMUL_ROWS,
    MATMUL_WIDTH,
    T_FORWARD,
    pipeline_configs,
    pipeline_ours,
    pipeline_worker,
)
from benchmarks.parallel_zero import (
    FP32,
    HEADS,
    HIDDEN,
    LAYERS,
    MBS,
    SEQ,
    VOCAB,
    ZERO_VARIANTS,
    engine_setup,
    zero_theory,
    zero_worker,
)
from bloomline.trainer.parallel.local_processes import run_distributed

__all__ = ["main", "measure", "report"]


# ---------------------------------------------------------------------------- measuring


def measure_zero(args) -> dict:
    results = {}
    for dp in args.dp:
        print(f"ZeRO: {len(ZERO_VARIANTS)} variants at dp = {dp} ...", flush=True)
        load = OtherLoad(descendants_cpu_seconds).start()
        ranks = run_distributed(dp, zero_worker, dp, ZERO_VARIANTS, args.zero_steps)
        results[dp] = {"ranks": ranks, "other": load.cores()}
        print(f"ZeRO dp = {dp}: done; other processes {results[dp]['other']:.2f} cores",
              flush=True)
    return results


def measure_pipeline(args) -> dict:
    results = {}
    for p in args.pp:
        kinds = [k for k in args.compute if k == "wait" or p <= 2]  # CPU work: p <= 2 only
        configs = [c for kind in kinds for c in pipeline_configs(p, kind, args.quick)]
        print(f"pipeline: {len(configs)} configurations on p = {p} ranks ...", flush=True)
        load = OtherLoad(descendants_cpu_seconds).start()
        ranks = run_distributed(p, pipeline_worker, p, configs, args.pipe_rounds,
                                args.pipe_steps)
        results[p] = {"ranks": ranks, "other": load.cores()}
        print(f"pipeline p = {p}: done; other processes {results[p]['other']:.2f} cores",
              flush=True)
    return results


def measure_engines(args) -> dict:
    import torch

    from bloomline.trainer.precision import fast_low_precision

    precisions = [p for p in args.engine_precisions
                  if p == "fp32" or fast_low_precision(p, torch.device("cpu"))]
    skipped = sorted(set(args.engine_precisions) - set(precisions))
    cases = engine_cases(precisions, args.engine_micro_batches)
    results = {}
    for dp in args.engine_dp:
        print(f"engines: {len(cases)} cases at dp = {dp} ...", flush=True)
        load = OtherLoad(descendants_cpu_seconds).start()
        ranks = run_distributed(dp, engines_worker, engine_setup, dp, cases,
                                args.engine_rounds, args.engine_steps, args.engine_warmup)
        results[dp] = {"summary": engine_summary(ranks, dp), "other": load.cores()}
        print(f"engines dp = {dp}: done; other processes {results[dp]['other']:.2f} cores",
              flush=True)
    return {"dp": results, "skipped": skipped, "rounds": args.engine_rounds,
            "steps": args.engine_steps, "warmup": args.engine_warmup}


# ---------------------------------------------------------------------------- reporting


def _mib(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value / 2**20:>9.2f}"


def _zero_rows(results: dict):
    """(dp, label, stage, offload, per-rank results or None, error) in table order."""
    for dp, res in results.items():
        for label, (stage, offload, _engine) in ZERO_VARIANTS.items():
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
          "all-reduce: 2, 3, 3, 4 x (N-1)/N x 4 Psi for stages 0, 1, 2, 3 (fsdp2's ZeRO-1 "
          "all-reduces the whole gradient, then all-gathers the updated shards; the buffers "
          "engine reduce-scatters its fp32 buckets, then all-gathers the updated rows, fp32 "
          "here); collectives: gloo's, from one profiled step on rank 0, with the mean MiB of "
          "their first input (reduce-scatters appear as all_reduce).")
    for dp, res in results.items():
        notes.append(f"ZeRO dp {dp}: other processes {res['other']:.2f} cores during the runs")


def report_engines(measured: dict, targets: list, notes: list) -> None:
    results = measured["dp"]
    summaries = {dp: res["summary"] for dp, res in results.items()}
    print_engine_table("(4) ZeRO-1/2 engines: buffers beside fsdp2, same ranks, interleaved "
                       "rounds", summaries, notes, targets)
    first = next((f for s in summaries.values() for f in s.values() if "numel" in f), None)
    numel = first["numel"] if first else 0
    print(f"model: the GPT of (1) (Psi = {numel:,}), micro-batch {MBS} x L {SEQ} per rank; mb: "
          "micro-batches per step. step ms: the median over "
          f"{measured['rounds']} rounds x {measured['steps']} steps (after "
          f"{measured['warmup']} warm-up steps) of the slowest rank's train_step; vs fsdp2: the "
          "median of per-round ratios of the round's median step (below 1: buffers faster); "
          "calls: collective calls in one step on rank 0 (the wrapped torch.distributed and "
          "functional-collective functions; '~': not the same on every step); gloo ops: the "
          "collectives gloo ran in one profiled step on rank 0 (the cross-check: equal to "
          "calls when every path is wrapped); sent MiB: written to sockets per step (median, "
          "max over ranks); on gloo: what the engine must send (fsdp2 ZeRO-1: 3 x (N-1)/N x 4 "
          "Psi per step; fsdp2 ZeRO-2: 3 x (N-1)/N x 4 Psi per micro-batch; buffers: 2 x "
          "(N-1)/N x 4 Psi per reduce-scatter (once per step at ZeRO-1, per micro-batch at "
          "ZeRO-2: gloo's reduce-scatter costs an all-reduce) + (N-1)/N x Psi x 2 (bf16) or 4 "
          "bytes for the all-gather); states: model states at the optimizer step (MiB, as "
          "(1); the buffers engine's bf16 runs hold bf16 parameters, fp32 gradient buffers "
          "and fp32 master rows); peak: held at the step's start + the most torch allocated "
          "during it (MiB, max over ranks; profiler memory events); loss: rank 0's after the "
          "last step (both engines see the same batches: equal in fp32; in bf16 the buffers "
          "engine computes with bf16 parameters, fsdp2 with fp32 ones under autocast); "
          "collectives: per step on rank 0, calls x the mean MiB of the whole tensor (an "
          "all-gather's output, a reduce-scatter's input).")
    for precision in measured["skipped"]:
        notes.append(f"engines: {precision} skipped: this CPU has no fast {precision} path")
    for dp, res in results.items():
        notes.append(f"engines dp {dp}: other processes {res['other']:.2f} cores during the "
                     "runs")


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="zero,pipeline,engines")
    parser.add_argument("--dp", default="2,4", help="data-parallel sizes of the ZeRO part")
    parser.add_argument("--pp", default="2,4", help="pipeline sizes of the bubble part")
    parser.add_argument("--compute", default="wait,matmul,gpt",
                        help="stage compute kinds (gpt: our Trainer's pipeline)")
    parser.add_argument("--zero-steps", type=int, default=3, help="measured steps per variant")
    parser.add_argument("--pipe-rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--pipe-steps", type=int, default=1, help="steps per config per round")
    parser.add_argument("--engine-dp", default="2", help="data-parallel sizes of the engines")
    parser.add_argument("--engine-precisions", default="fp32,bf16")
    parser.add_argument("--engine-micro-batches", default="1,4",
                        help="micro-batches per step of the engines part")
    parser.add_argument("--engine-rounds", type=int, default=5,
                        help="interleaved rounds of the engines part")
    parser.add_argument("--engine-steps", type=int, default=3,
                        help="steps per case per round of the engines part")
    parser.add_argument("--engine-warmup", type=int, default=2,
                        help="warm-up steps per case of the engines part")
    parser.add_argument("--quick", action="store_true",
                        help="dp 2 and p 2 only, fewer micro-batch counts, 1 round; engines: "
                             "1 micro-batch, 2 rounds of 1 step")
    args = parser.parse_args(argv)
    args.dp = [int(v) for v in args.dp.split(",")]
    args.pp = [int(v) for v in args.pp.split(",")]
    args.compute = args.compute.split(",")
    args.engine_dp = [int(v) for v in args.engine_dp.split(",")]
    args.engine_precisions = args.engine_precisions.split(",")
    args.engine_micro_batches = [int(v) for v in args.engine_micro_batches.split(",")]
    if args.quick:
        args.dp, args.pp, args.zero_steps, args.pipe_rounds = [2], [2], 2, 1
        args.engine_dp, args.engine_micro_batches = [2], [1]
        args.engine_rounds, args.engine_steps, args.engine_warmup = 2, 1, 1
    return args


def measure(args: argparse.Namespace) -> dict:
    """``{"zero": {dp: {"ranks", "other"}}, "pipeline": {p: {"ranks", "other"}},
    "engines": {"dp": {dp: {"summary", "other"}}, ...}}``, a part not asked for empty; the
    machine header printed first."""
    parts = set(args.parts.split(","))
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # the spawned ranks too
    print(machine_report("gloo"), flush=True)
    return {"zero": measure_zero(args) if "zero" in parts else {},
            "pipeline": measure_pipeline(args) if "pipeline" in parts else {},
            "engines": measure_engines(args) if "engines" in parts else {}}


def report(measured: dict) -> int:
    """Print each part's table, the notes, the load warning and the targets."""
    targets: list[str] = []
    notes: list[str] = []
    others = []
    zero, pipe = measured["zero"], measured["pipeline"]
    if zero:
        report_zero(zero, targets, notes)
        report_bytes(zero, targets, notes)
        others += [r["other"] for r in zero.values()]
    if pipe:
        report_pipeline(pipe, targets, notes)
        others += [r["other"] for r in pipe.values()]
    engines = measured.get("engines")
    if engines:
        report_engines(engines, targets, notes)
        others += [r["other"] for r in engines["dp"].values()]
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


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
