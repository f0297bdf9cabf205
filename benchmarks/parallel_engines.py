"""The ZeRO-1/2 engines side by side, measured in the same run: the buffers engine
(``parallel/grad_buffers.py`` + ``parallel/distributed_optimizer.py``, Megatron's distributed
optimizer) against FSDP2's (``parallel.zero_engine = "fsdp2"``: ``replicate`` + the sharded
optimizer at ZeRO-1, ``fully_shard`` at ZeRO-2). Shared by ``benchmarks.parallel`` (its tiny
GPT, the ``engines`` part) and ``benchmarks.train`` (its model, the dp rows).

What each rank runs (``engines_worker``): per precision, one ``Trainer`` per case (ZeRO stage,
engine, micro-batches per step), all built first; ``warmup`` steps each; then ``rounds``
rounds, each running ``steps`` steps of every case, the order reversed every other round (the
cases share the machine's drift). Every step starts after a barrier; its time is the rank's
wall time of ``Trainer.train_step`` (forward and backward of every micro-batch, the gradient
reduction, the clip, the optimizer step and the parameters' all-gather); the bytes the process
wrote to its sockets during it (``wchar``, gloo's TCP pairs), and the collectives it called
(``harness/collectives.py``: the wrapped ``torch.distributed`` and functional-collective
functions, counted only inside the step). After the rounds, one more step per case runs under
``torch.profiler`` with memory profiling: gloo's own collective events (the cross-check of the
count) and the peak of the bytes torch allocated during the step, on top of what the case held
when it began (its parameters, gradients, gradient buffers, fp32 masters and optimizer state,
each storage once); its optimizer step is wrapped to count the model states as
``benchmarks.parallel``'s (1) does (``parallel/memory.py``).

Reported (``engine_summary``): step time = the median over the measured steps of the slowest
rank's time; the ratio to FSDP2 = the median over rounds of (buffers / fsdp2) of the rounds'
median step times; calls per step from rank 0 (the same on every step; a case whose count
varies between steps says so); bytes sent per step (median, max over ranks) against what the
engine must send on gloo (``engine_theory``).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import Counter

import torch

from benchmarks.harness.collectives import CollectiveCounter, bytes_written, gloo_ops

__all__ = ["ENGINES", "engine_cases", "engine_summary", "engine_theory", "engines_worker",
           "print_engine_table"]

ENGINES = ("fsdp2", "buffers")
STAGES = (1, 2)


def engine_cases(precisions, micro_batches=(1,)) -> list[tuple]:
    """``(stage, engine, precision, micro-batches)`` for ZeRO-1/2 on both engines."""
    return [(stage, engine, precision, mb) for precision in precisions for mb in micro_batches
            for stage in STAGES for engine in ENGINES]


def case_label(case: tuple) -> str:
    stage, engine, precision, mb = case
    return f"ZeRO-{stage} {precision} mb{mb} {engine}"


# ---------------------------------------------------------------------------- one rank


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _held_bytes(model, optimizer) -> int:
    """What a case holds between steps: parameters, gradients, the buffers engine's buckets,
    the optimizer's parameters (fp32 masters, ZeRO-1 slices: views) and state; each storage
    once."""
    params = list(model.parameters())
    tensors = params + [p.grad for p in params]
    inner = getattr(optimizer, "inner", optimizer)
    for group in inner.param_groups:
        tensors += list(group["params"])
    for state in inner.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.ndim]
    buffers = getattr(optimizer, "buffers", None)
    for bucket in getattr(buffers, "buckets", ()):
        tensors += [bucket.buffer, bucket.shard]
    return _storage_bytes(tensors)


def _allocation_peak(prof) -> int:
    """The highest net bytes torch allocated during a profiled region: each op's own
    allocations minus frees (``self_cpu_memory_usage``; frees outside an op are ``[memory]``
    events), summed in the order the ops started. An op's temporaries freed before it ends
    are not seen: a lower bound of the true peak, by at most one op's scratch."""
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def _engine_of(trainer) -> str:
    return "buffers" if hasattr(trainer.optimizer, "reduce_gradients") else "fsdp2"


def _profiled_step(trainer, batch, lr, counter: CollectiveCounter) -> dict:
    """One step under the profiler: gloo's collectives, the allocation peak, the model states
    at the optimizer step (``parallel/memory.py``), the collectives counted here."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.parallel_zero import _quiet_stderr
    from bloomline.trainer.parallel.memory import model_state_bytes

    model, optimizer = trainer.model, trainer.optimizer
    states: dict[str, int] = {}

    def step_counted(*args, step=optimizer.step, **kwargs):
        found = model_state_bytes(model, optimizer, "cpu", False)
        states.update(params=found["params_device"], grads=found["grads_device"])
        result = step(*args, **kwargs)
        states["optim"] = model_state_bytes(model, optimizer, "cpu", False)["optim_device"]
        return result

    held = _held_bytes(model, optimizer)
    optimizer.step = step_counted  # an instance attribute, as in benchmarks.parallel_zero
    try:
        counter.start()
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                      profile_memory=True) as prof:
            trainer.train_step(batch, lr)
        calls = counter.stop()
    finally:
        del optimizer.step
    return {"gloo": dict(gloo_ops(prof)), "held": held, "peak": held + _allocation_peak(prof),
            "states": states, "profiled_calls": {k: len(v) for k, v in calls.items()}}


def engines_worker(setup, dp: int, cases: list[tuple], rounds: int, steps: int,
                   warmup: int) -> dict:
    """On every rank: ``{case: {...}}`` per case (see the module docstring), the cases of one
    precision built and measured together. ``setup(dp, stage, engine, precision, mb)`` ->
    ``(Config, micro-batches)`` is a module-level function (pickled by reference)."""
    import torch.distributed as dist

    from bloomline.trainer.loop import Trainer

    counter = CollectiveCounter().install()
    out: dict = {}
    precisions = list(dict.fromkeys(case[2] for case in cases))
    for precision in precisions:
        built = {}
        for case in (c for c in cases if c[2] == precision):
            stage, engine, _, mb = case
            cfg, batch = setup(dp, stage, engine, precision, mb)
            try:
                trainer = Trainer(cfg, log=lambda *_: None)
            except Exception as error:  # noqa: BLE001 - reported, skipped
                out[case] = {"error": f"{type(error).__name__}: {error}"[:300]}
                continue
            built[case] = (trainer, batch, trainer.cfg.optimizer.lr)
            out[case] = {"engine": _engine_of(trainer), "seconds": [], "wire": [],
                         "calls": [], "losses": [],
                         "numel": sum(p.numel() for p in trainer.full_model_state().values())}
        for case, (trainer, batch, lr) in built.items():
            for _ in range(warmup):
                out[case]["losses"].append(trainer.train_step(batch, lr)["loss"])
        order = list(built)
        for round_no in range(rounds):
            for case in (order if round_no % 2 == 0 else order[::-1]):
                trainer, batch, lr = built[case]
                found = out[case]
                seconds, wire, calls = [], [], []
                for _ in range(steps):
                    dist.barrier()
                    before = bytes_written()
                    counter.start()
                    start = time.perf_counter()
                    loss = trainer.train_step(batch, lr)["loss"]
                    seconds.append(time.perf_counter() - start)
                    called = counter.stop()
                    wire.append(bytes_written() - before)
                    calls.append({kind: (len(sizes), sum(sizes))
                                  for kind, sizes in called.items()})
                    found["losses"].append(loss)
                found["seconds"].append(seconds)
                found["wire"].append(wire)
                found["calls"].extend(calls)
        for case, (trainer, batch, lr) in built.items():
            dist.barrier()
            out[case].update(_profiled_step(trainer, batch, lr, counter))
        del built, trainer
        gc.collect()
    counter.uninstall()
    return out


# ---------------------------------------------------------------------------- theory, summary


def engine_theory(stage: int, engine: str, precision: str, mb: int, numel: int,
                  dp: int) -> float:
    """Bytes a rank must write per step on gloo (Psi = ``numel``, N = dp; a ring all-gather
    sends (N-1)/N of the whole tensor, gloo's reduce-scatter costs an all-reduce, 2(N-1)/N):
    fsdp2 ZeRO-1: the fp32 gradient all-reduced once per step, the fp32 parameters
    all-gathered; fsdp2 ZeRO-2: per micro-batch, the fp32 parameters all-gathered in forward
    and the gradient reduce-scattered; buffers: the fp32 gradient buffer reduce-scattered once
    per step (ZeRO-1) or per micro-batch (ZeRO-2), the parameters all-gathered once in their
    dtype (bf16: 2 bytes). The loss and norm all-reduces (a few bytes) are left out."""
    ring = (dp - 1) / dp * numel
    param_bytes = 2 if (engine == "buffers" and precision == "bf16") else 4
    if engine == "fsdp2":
        return (3 * ring * 4) if stage == 1 else mb * 3 * ring * 4
    reductions = 1 if stage == 1 else mb
    return reductions * 2 * ring * 4 + ring * param_bytes


def _mode(values: list):
    return Counter(values).most_common(1)[0][0] if values else None


def engine_summary(ranks: list[dict], dp: int) -> dict:
    """Per case, from every rank's ``engines_worker`` result: ``step`` (s), ``rounds`` (the
    per-round medians), ``ratio`` (buffers / fsdp2 of the same stage, precision and
    micro-batches; None for fsdp2), ``calls`` ({kind: (calls, bytes)} per step on rank 0),
    ``steady`` (whether every measured step had those calls), ``wire``, ``theory``, ``gloo``,
    ``peak``, ``states``, ``loss``, ``engine`` (as built), or ``error``."""
    summary: dict = {}
    for case, first in ranks[0].items():
        if "error" in first:
            summary[case] = {"error": first["error"]}
            continue
        stage, engine, precision, mb = case
        per_rank = [r[case] for r in ranks]
        rounds = []
        slowest_steps = []
        for round_no in range(len(first["seconds"])):
            slowest = [max(r["seconds"][round_no][i] for r in per_rank)
                       for i in range(len(first["seconds"][round_no]))]
            slowest_steps += slowest
            rounds.append(statistics.median(slowest))
        calls = [tuple(sorted(c.items())) for c in first["calls"]]
        usual = _mode(calls)
        wire = max(statistics.median(w for ws in r["wire"] for w in ws) for r in per_rank)
        summary[case] = {
            "engine": first["engine"], "step": statistics.median(slowest_steps),
            "rounds": rounds, "calls": dict(usual or ()),
            "steady": all(c == usual for c in calls), "wire": wire,
            "theory": engine_theory(stage, engine, precision, mb, first["numel"], dp),
            "gloo": first["gloo"], "profiled_calls": first["profiled_calls"],
            "peak": max(r["peak"] for r in per_rank), "held": max(r["held"] for r in per_rank),
            "states": max(sum(r["states"].values()) for r in per_rank),
            "loss": first["losses"][-1], "first_loss": first["losses"][0],
            "numel": first["numel"], "ratio": None}
    for case, found in summary.items():
        stage, engine, precision, mb = case
        base = summary.get((stage, "fsdp2", precision, mb))
        if engine != "fsdp2" and base and "error" not in found and "error" not in base:
            pairs = [a / b for a, b in zip(found["rounds"], base["rounds"], strict=True) if b]
            found["ratio"] = statistics.median(pairs) if pairs else None
    return summary


def _calls_text(calls: dict) -> str:
    return ", ".join(f"{kind} {count} x {size / count / 2**20:.2f}"
                     for kind, (count, size) in sorted(calls.items()) if count) or "none"


def print_engine_table(title: str, summaries: dict, notes: list, targets: list | None = None,
                       tokens_per_step: int | None = None) -> None:
    """The table of ``{dp: engine_summary}``; ``tokens_per_step`` (global, per micro-batch)
    adds a tokens/s column."""
    tok = f"{'tok/s':>8} " if tokens_per_step else ""
    header = (f"{'layout':<8} {'prec':<4} {'dp':>2} {'mb':>2} {'engine':<7} {'step ms':>8} "
              f"{tok}{'vs fsdp2':>8} {'calls':>5} {'sent MiB':>8} {'on gloo':>8} {'ratio':>5} "
              f"{'gloo ops':>8} {'states':>7} {'peak':>7} {'loss':>7}  "
              "collectives per step (calls x MiB)")
    print()
    print(title)
    print(header)
    print("-" * len(header))
    for dp, summary in summaries.items():
        for case, found in summary.items():
            stage, engine, precision, mb = case
            lead = f"{'ZeRO-' + str(stage):<8} {precision:<4} {dp:>2} {mb:>2} {engine:<7}"
            if "error" in found:
                print(f"{lead}  skipped: {found['error']}")
                continue
            calls = sum(count for count, _ in found["calls"].values())
            gloo = sum(found["gloo"].values())
            ratio = found["ratio"]
            rate = (f"{tokens_per_step * mb / found['step']:>8,.0f} " if tokens_per_step
                    else "")
            print(f"{lead} {1e3 * found['step']:>8.1f} {rate}"
                  f"{(f'{ratio:.2f}x' if ratio else '-'):>8} "
                  f"{calls:>4}{'' if found['steady'] else '~'} {found['wire'] / 2**20:>8.2f} "
                  f"{found['theory'] / 2**20:>8.2f} {found['wire'] / found['theory']:>5.2f} "
                  f"{gloo:>8} {found['states'] / 2**20:>7.1f} {found['peak'] / 2**20:>7.1f} "
                  f"{found['loss']:>7.4f}  {_calls_text(found['calls'])}")
            label = f"ZeRO-{stage} {precision} dp {dp} mb {mb} {engine}"
            if found["engine"] != engine:
                notes.append(f"{label}: built the {found['engine']} engine")
            if ratio:
                notes.append(f"{label}: step time {ratio:.2f}x fsdp2's "
                             f"({'faster' if ratio < 1 else 'slower'}; per round "
                             + ", ".join(f"{1e3 * r:.0f}" for r in found["rounds"])
                             + " ms against "
                             + ", ".join(f"{1e3 * r:.0f}" for r in
                                         summary[(stage, "fsdp2", precision, mb)]["rounds"])
                             + ")")
            if targets is None:
                continue
            targets.append(f"target: {label} collectives counted = gloo's: {calls} vs {gloo} "
                           f"{'PASS' if calls == gloo and found['steady'] else 'FAIL'}")
            gain = found["wire"] / found["theory"]
            targets.append(f"target: {label} bytes sent within 10% of what the engine must "
                           f"send on gloo: {gain:.2f}x "
                           f"{'PASS' if abs(gain - 1) <= 0.10 else 'FAIL'}")
