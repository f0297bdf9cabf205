"""Where a dp 2 step of ``benchmarks.train``'s model goes on each ZeRO-2 engine (and ZeRO-1 on
the buffers engine): a diagnosis for the engines' rows of ``benchmarks.train`` and
``benchmarks.parallel`` (4), not a benchmark with a target.

On both engines ``Trainer.train_step``'s ``forward_backward`` and ``optimizer.step`` are timed;
on the buffers engine also its internals, by wrapping its methods in the ranks (nested: a
hook's time includes its add): the gradient hooks (``GradBuffers._accumulate``), the add into
the bucket (``Region.scatter_add``), ZeRO-2's new zeroed buffer (``Bucket._new_buffer``), the
reduce-scatter's launch and wait (``Bucket.start_reduce`` / ``finish_reduce``),
``GradBuffers.reduce``, the clip, the inner Adam step, the publish (``GradBuffers.gather``: the
all-gather call, the copy back into the parameters) and ``zero``. Cases are stepped in
interleaved rounds after 2 warm-up steps; medians per rank. ``--bucket-sizes`` adds ZeRO-2
buffers cases with that ``parallel.bucket_size``. The names wrapped are the engine's as of
2026-11-27; a renamed one is reported missing, not timed.

Run: ``python -m benchmarks.engine_profile [--rounds 5] [--steps 2]
[--precisions bf16,fp32] [--bucket-sizes 2000000]``. Results: ``docs/perf/zero-engines.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import defaultdict

from benchmarks.harness.machine import machine_report

__all__ = ["main"]

_CURRENT: list = [None]
_TIMES: dict = defaultdict(lambda: defaultdict(float))  # case -> name -> seconds, this step
# (module, attribute, label): the buffers engine's parts, wrapped in the ranks
_PARTS = [
    ("grad_buffers", "GradBuffers._accumulate", "hooks (all)"),
    ("grad_buffers", "Region.scatter_add", "hooks: add into the bucket"),
    ("grad_buffers", "Bucket._new_buffer", "hooks: new [dp, S] fp32 zeros (ZeRO-2)"),
    ("grad_buffers", "Bucket.start_reduce", "reduce-scatter launch"),
    ("grad_buffers", "Bucket.finish_reduce", "reduce-scatter wait (+ ZeRO-2 shard add)"),
    ("grad_buffers", "GradBuffers.reduce", "reduce() after backward"),
    ("grad_buffers", "GradBuffers.gather", "publish: gather() in all"),
    ("grad_buffers", "_ALL_GATHER", "publish: all-gather call"),
    ("grad_buffers", "Region.gather_copy", "publish: copy back into the parameters"),
    ("grad_buffers", "GradBuffers.zero", "zero_grad"),
    ("distributed_optimizer", "DistributedOptimizer.clip_grad_norm", "clip"),
]


def _timed(label: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if _CURRENT[0] is not None:
                _TIMES[_CURRENT[0]][label] += time.perf_counter() - start
    return wrapper


def _wrap_engine() -> list[str]:
    """Wrap ``_PARTS``; the labels of those not found."""
    import importlib

    missing = []
    for module_name, path, label in _PARTS:
        owner = importlib.import_module(f"bloomline.trainer.parallel.{module_name}")
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, name):
            missing.append(label)
            continue
        setattr(owner, name, _timed(label, getattr(owner, name)))
    return missing


def _build(case: tuple):
    from benchmarks.harness.train_setup import dp_engine_setup
    from bloomline.trainer.loop import Trainer

    stage, engine, precision, bucket = case
    cfg, batch = dp_engine_setup(2, stage, engine, precision, 1)
    if bucket:
        cfg.parallel.bucket_size = bucket
    trainer = Trainer(cfg, log=lambda *_: None)
    runner, optimizer = trainer.runner, trainer.optimizer
    runner.forward_backward = _timed("forward + backward", runner.forward_backward)
    optimizer.step = _timed("optimizer step", optimizer.step)
    inner = getattr(optimizer, "inner", None)
    if inner is not None and engine == "buffers":
        inner.step = _timed("optimizer step: inner Adam", inner.step)
    return trainer, batch, cfg.optimizer.lr


def profile_worker(cases: list[tuple], rounds: int, steps: int) -> dict:
    """On every rank: per case, the step times and each timed part's time per step."""
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    missing = _wrap_engine()
    built = {case: _build(case) for case in cases}
    out = {case: {"step": [], "parts": defaultdict(list)} for case in cases}
    for trainer, batch, lr in built.values():
        for _ in range(2):
            trainer.train_step(batch, lr)
    for round_no in range(rounds):
        for case in (cases if round_no % 2 == 0 else cases[::-1]):
            trainer, batch, lr = built[case]
            for _ in range(steps):
                dist.barrier()
                _TIMES[case].clear()
                _CURRENT[0] = case
                start = time.perf_counter()
                trainer.train_step(batch, lr)
                out[case]["step"].append(time.perf_counter() - start)
                _CURRENT[0] = None
                for label, seconds in _TIMES[case].items():
                    out[case]["parts"][label].append(seconds)
    return {"missing": missing,
            "cases": {case: {"step": found["step"], "parts": dict(found["parts"])}
                      for case, found in out.items()}}


def main(argv: list[str] | None = None) -> int:
    from bloomline.trainer.parallel.local_processes import run_distributed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--bucket-sizes", default="",
                        help="extra ZeRO-2 buffers cases with these bucket sizes")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    print(machine_report("gloo"), flush=True)
    buckets = [int(v) for v in args.bucket_sizes.split(",") if v]
    cases = [case for precision in args.precisions.split(",") for case in
             [(2, "fsdp2", precision, 0), (2, "buffers", precision, 0),
              (1, "buffers", precision, 0)] + [(2, "buffers", precision, b) for b in buckets]]
    ranks = run_distributed(2, profile_worker, cases, args.rounds, args.steps)
    if ranks[0]["missing"]:
        print("not found in the engine (not timed): " + ", ".join(ranks[0]["missing"]))
    for case in cases:
        found = [r["cases"][case] for r in ranks]
        slowest = [max(times) for times in zip(*(f["step"] for f in found), strict=True)]
        stage, engine, precision, bucket = case
        print(f"\nZeRO-{stage} {engine}{f' bucket {bucket:,}' if bucket else ''} {precision}: "
              f"step {1e3 * statistics.median(slowest):.0f} ms (median of the slowest rank, "
              f"{len(slowest)} steps)")
        for label in sorted(found[0]["parts"]):
            shown = ", ".join(f"rank {rank} {1e3 * statistics.median(f['parts'][label]):.1f}"
                              for rank, f in enumerate(found) if label in f["parts"])
            print(f"  {label:<44} {shown} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
