"""Training-step throughput of ``Trainer.train_step`` against transformers' BloomForCausalLM,
the AdamW step alone, the data loader against what the model consumes, and the activation stats'
cost. Run: ``make bench-train`` or ``python -m benchmarks.train [--quick] [--compile]
[--diagnose]``.

One model shape for both (``benchmarks.harness.train_setup``: 6 layers, hidden 384, 6 heads,
vocabulary 8064, no dropout, tied embeddings), micro-batch 8 of L = 256 tokens, the same batch
of random token ids every step, on CPU:

  (a) ours: ``Trainer.train_step([tokens], lr)`` with ``tokens`` [8, 257] int64: exactly what
      the training loop runs per step (forward under the precision policy, the LM head fused
      with the fp32 cross-entropy, backward, clip to 1.0, ``build_optimizer``'s AdamW step,
      zero_grad);
  (b) transformers: ``BloomForCausalLM`` with fp32 parameters, a stock ``torch.optim.AdamW``
      with the same hyperparameters and weight decay groups, ``labels=input_ids`` on the first
      256 tokens, backward, ``clip_grad_norm_(1.0)``, step, ``zero_grad``;
  in ``bf16`` (fp32 master weights under ``torch.autocast``) and ``fp32``. ``--compile`` adds
  ours with ``train.compile = true``; ``--diagnose`` adds ours with ``model.attention =
  "sdpa"``, to show why ``auto`` picks eager on CPU.

  (c) the ZeRO engines at dp 2 (``--dp``; ``--skip-dp`` leaves them out): ours on 2 gloo
      processes of one thread each, ZeRO-1 and ZeRO-2 on the buffers engine against FSDP2's,
      in each precision, in the same ranks and interleaved rounds (``benchmarks.train_dp``):
      a row per stage and precision, and a table of step times, collective calls per step,
      bytes sent and memory per case.

The process runs with ``bloomline.trainer.malloc``'s thresholds (what ``Trainer`` does by
default, process-wide, so the baseline gets the same allocator); ``--default-malloc`` keeps
glibc's defaults for both.

Each precision warms every contestant up (``--warmup`` steps), then runs ``--rounds`` rounds of
``--steps`` steps per contestant, the order reversed every round; each ratio is taken within a
round and the median over rounds reported (``harness.stats``). The limit of a step is the
matmul peak measured once per round (``measure_peak_flops``, the highest used) over the model
FLOPs per token (forward + backward): ours/limit is the MFU. The optimizer step alone (random
gradients) compares ours, the stock AdamW and ``fused=True`` against AdamW's memory traffic
(28 bytes a parameter) at the bandwidth of a 256 MiB tensor copy. The loader reads the demo
corpus (``build/demo/corpus``, made with ``make demo``'s dataprep commands when missing) with 2
workers, against an in-process loop stacking ``train[i]`` (two of them are the limit) and what
the model consumes. A precision the CPU has no fast oneDNN path for is skipped with the reason
in its target line. The load of other processes is printed per round.

Targets: ours >= 1.2x transformers' tokens/s in each precision; loader >= 20x the model's
consumption; activation stats < 2% of step time. Run times and results:
``benchmarks/results/train.md`` and ``results/bench_train.txt``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import torch

from benchmarks.harness.machine import OtherLoad, load_average, machine_report, relative
from benchmarks.harness.paths import REPO
from benchmarks.harness.stats import median, ratio
from benchmarks.harness.table import cell, number, print_table
from benchmarks.harness.train_setup import (
    BETAS,
    COMPILED,
    DIAG_SDPA,
    DTYPES,
    EPS,
    HEADS,
    HF,
    HIDDEN,
    LAYERS,
    LR,
    MBS,
    SEED,
    SEQ,
    TRAIN_SAMPLES,
    TUNE_MALLOC,
    VOCAB,
    decay_groups,
    hf_step,
    ours_step,
    random_tokens,
    trainer_config,
)
from benchmarks.train_dp import dp_rows, dp_table, measure_dp_engines
from bloomline.trainer.config import Config
from bloomline.trainer.data import MegatronSampler, make_loader, open_splits
from bloomline.trainer.loop import Trainer
from bloomline.trainer.malloc import tune_malloc
from bloomline.trainer.model import build_model
from bloomline.trainer.optim import build_optimizer
from bloomline.trainer.precision import fast_low_precision
from bloomline.trainer.reporting.mfu import measure_peak_flops

__all__ = ["main", "measure", "report"]


# ---------------------------------------------------------------------------- measuring


def measure_steps(precision: str, args, tokens: torch.Tensor) -> dict:
    """Per-round tokens/s of every contestant, the peaks, the losses and the other load."""
    makers: dict[str, Callable[[], Callable[[], float]]] = {
        "ours": lambda: ours_step(precision, tokens)}
    if args.with_hf:
        makers[HF] = lambda: hf_step(precision, tokens)
    if args.compile:
        makers[COMPILED] = lambda: ours_step(precision, tokens, compile_model=True)
    if args.diagnose:
        makers[DIAG_SDPA] = lambda: ours_step(precision, tokens, attention="sdpa")
    steps, losses, notes = {}, {}, []
    for name, make in makers.items():
        print(f"{precision}: building and warming up {name} ...", flush=True)
        try:
            step = make()
            warm = []
            for _ in range(args.warmup):
                start = time.perf_counter()
                losses.setdefault(name, []).append(step())
                warm.append(time.perf_counter() - start)
        except Exception as error:  # noqa: BLE001 - an optional contestant may fail
            if name == "ours":
                raise
            losses.pop(name, None)
            reason = str(error).strip().splitlines()
            notes.append(f"{precision}: {name} skipped: {type(error).__name__}: "
                         f"{reason[0][:200] if reason else ''}")
            print(notes[-1], flush=True)
            continue
        if name == COMPILED:
            notes.append(f"{precision}: {name}: warm-up steps took "
                         f"{', '.join(f'{w:.1f}' for w in warm)} s (compiling)")
        steps[name] = step
    names = list(steps)
    rates: dict[str, list[float]] = {name: [] for name in names}
    peaks, others = [], []
    for round_no in range(args.rounds):
        order = names if round_no % 2 == 0 else names[::-1]
        load = OtherLoad().start()
        peaks.append(measure_peak_flops(torch.device("cpu"), DTYPES[precision]))
        for name in order:
            start = time.perf_counter()
            for _ in range(args.steps):
                losses[name].append(steps[name]())
            rates[name].append(args.steps * MBS * SEQ / (time.perf_counter() - start))
        others.append(load.cores())
        print(f"{precision} round {round_no + 1}/{args.rounds}: " + ", ".join(
            f"{name} {rates[name][-1]:,.0f}" for name in order) + " tokens/s; peak "
            f"{peaks[-1] / 1e9:,.0f} GFLOP/s; other processes {others[-1]:.2f} cores",
            flush=True)
    return {"rates": rates, "peaks": peaks, "losses": losses, "others": others,
            "notes": notes}


def measure_activation_stats(args, tokens: torch.Tensor, precision: str) -> dict:
    """Our step with the activation stats on against the same step without, alternating within
    each round (the same trainer, so the same weights and caches)."""
    cfg = trainer_config(precision)
    trainer = Trainer(cfg, log=lambda *_: None)
    lr = cfg.optimizer.lr
    for _ in range(args.warmup):
        trainer.train_step([tokens], lr, activation_stats=True)
        trainer.train_step([tokens], lr)
    plain, stats = [], []
    for round_no in range(args.rounds * args.steps):
        order = (False, True) if round_no % 2 == 0 else (True, False)
        for on in order:
            start = time.perf_counter()
            trainer.train_step([tokens], lr, activation_stats=on)
            (stats if on else plain).append(time.perf_counter() - start)
    return {"plain": plain, "stats": stats, "precision": precision}


def measure_optimizer(args) -> dict:
    """optimizer.step() alone on our model's parameters with random gradients: ours
    (build_optimizer), stock torch.optim.AdamW (what the transformers step uses) and
    fused=True (the default of transformers' Trainer on torch >= 2.8), against the memory
    traffic of AdamW (read parameter, gradient, two moments; write three) at the bandwidth of
    a large tensor copy."""
    model = build_model(trainer_config("fp32").model, "cpu", seed=SEED)
    generator = torch.Generator().manual_seed(SEED)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=generator) * 1e-3
    optimizers = {"ours": build_optimizer(model, trainer_config("fp32").optimizer),
                  "torch default": torch.optim.AdamW(decay_groups(model), lr=LR, betas=BETAS,
                                                     eps=EPS),
                  "fused": torch.optim.AdamW(decay_groups(model), lr=LR, betas=BETAS, eps=EPS,
                                             fused=True)}
    numel = sum(p.numel() for p in model.parameters())
    source = torch.ones(1 << 26)  # 256 MiB
    target = torch.empty_like(source)
    rates: dict[str, list[float]] = {name: [] for name in optimizers}
    bandwidths = []
    for round_no in range(args.rounds + 2):  # the first two are warm-up
        start = time.perf_counter()
        target.copy_(source)
        bandwidth = 2 * source.numel() * 4 / (time.perf_counter() - start)
        names = list(optimizers) if round_no % 2 == 0 else list(optimizers)[::-1]
        for name in names:
            start = time.perf_counter()
            for _ in range(3):
                optimizers[name].step()
            rate = 3 / (time.perf_counter() - start)
            if round_no >= 2:
                rates[name].append(rate)
        if round_no >= 2:
            bandwidths.append(bandwidth)
    print(f"optimizer: {', '.join(f'{k} {median(v):,.1f}' for k, v in rates.items())} "
          f"steps/s; copy bandwidth {max(bandwidths) / 1e9:.1f} GB/s", flush=True)
    return {"rates": rates, "bandwidth": max(bandwidths), "numel": numel}


def ensure_corpus(corpus: Path) -> None:
    """The demo corpus, made with the dataprep commands of ``make demo`` if missing (the
    sample index is built by open_splits)."""
    if any(corpus.glob("*.idx")):
        return
    demo = corpus.parent
    dataprep = str(Path(sys.executable).with_name("dataprep"))
    print(f"{relative(corpus)} has no token files: building the demo corpus ...", flush=True)
    for cmd in ([dataprep, "demo-corpus", str(demo / "raw"), "--overwrite"],
                [dataprep, "train-tokenizer", str(demo / "raw"), "--vocab-size", "8000",
                 "--output", str(demo / "tokenizer" / "demo"), "--overwrite"],
                [dataprep, "tokenize", str(demo / "raw"), "--tokenizer",
                 str(demo / "tokenizer" / "demo.model"), "--output", str(corpus / "demo"),
                 "--overwrite"]):
        subprocess.run(cmd, check=True)


def measure_loader(args) -> dict:
    """Samples/s of the 2-worker loader and of the in-process loop, alternating first each
    round, and the loader's start-up (the time to its first batch)."""
    corpus = Path(args.corpus)
    ensure_corpus(corpus)
    train = open_splits(str(corpus), SEQ, TRAIN_SAMPLES, None, "98,2,0", SEED, None)["train"]
    total = min(args.loader_samples, len(train)) // MBS * MBS
    loader_rates, plain_rates, startups, others = [], [], [], []
    for round_no in range(args.loader_rounds):
        load = OtherLoad().start()
        for kind in (("loader", "plain") if round_no % 2 == 0 else ("plain", "loader")):
            sampler = MegatronSampler(total, 0, MBS)
            if kind == "plain":
                start, count = time.perf_counter(), 0
                for ids in sampler:
                    count += torch.stack([train[i] for i in ids]).shape[0]
                plain_rates.append(count / (time.perf_counter() - start))
                continue
            start = time.perf_counter()
            batches = iter(make_loader(train, sampler, num_workers=2, prefetch_factor=4,
                                       pin_memory=False))
            count = next(batches).shape[0]
            first = time.perf_counter()
            startups.append(first - start)
            for batch in batches:
                count += batch.shape[0]
            loader_rates.append((count - MBS) / (time.perf_counter() - first))
        others.append(load.cores())
        print(f"loader round {round_no + 1}/{args.loader_rounds}: 2 workers "
              f"{loader_rates[-1]:,.0f}, in-process {plain_rates[-1]:,.0f} samples/s "
              f"(first batch after {startups[-1]:.2f} s); other processes "
              f"{others[-1]:.2f} cores", flush=True)
    return {"loader": loader_rates, "plain": plain_rates, "startup": startups,
            "others": others, "samples": total, "split": len(train)}


# ---------------------------------------------------------------------------- reporting


def _step_rows(results: dict, flops: float, rows: list, targets: list, notes: list) -> None:
    """Rows, targets and notes of the train-step rounds of every precision."""
    for precision, res in results.items():
        rates, peak = res["rates"], max(res["peaks"])
        limit = peak / flops
        hf = rates.get(HF)
        for name, values in rates.items():
            if name == HF:
                continue
            label = f"train step {precision}, {name}, tokens/s"
            gain = ratio(values, hf) if hf else None
            rows.append((label, median(values), median(hf) if hf else None, gain, limit,
                         median(values) / limit))
            if name == "ours" and hf:
                targets.append(f"target: ours/{HF} >= 1.2x in {precision}: {gain:.2f}x "
                               f"{'PASS' if gain >= 1.2 else 'FAIL'}")
        mfu = ", ".join(f"{name} {100 * median(v) / limit:.1f}%" for name, v in rates.items())
        notes.append(f"{precision}: matmul peak {peak / 1e9:,.0f} GFLOP/s (highest of "
                     f"{', '.join(f'{p / 1e9:,.0f}' for p in res['peaks'])}); limit "
                     f"{limit:,.0f} tokens/s; MFU {mfu}; other processes "
                     f"{statistics.mean(res['others']):.2f} cores on average (max "
                     f"{max(res['others']):.2f})")
        notes.append(f"{precision}: loss first -> last step: " + ", ".join(
            f"{name} {values[0]:.4f} -> {values[-1]:.4f}"
            for name, values in res["losses"].items() if name in rates))
        notes.extend(res["notes"])
    if results:
        std = trainer_config("bf16").model.std
        notes.append(f"(ln {VOCAB} = {math.log(VOCAB):.3f}: ours starts higher because, with "
                     f"tied embeddings, the embedding LayerNorm and init std sqrt(2 / 5h) = "
                     f"{std:.4f}, the input token's own logit starts near h x std = "
                     f"{HIDDEN * std:.1f}; transformers' std is 0.02)")


def _activation_stats_rows(measured_stats: dict, rows: list, targets: list, notes: list) -> None:
    plain, hot = median(measured_stats["plain"]), median(measured_stats["stats"])
    interval = Config().monitor.activation_stats_interval
    extra = max(hot - plain, 0.0) / plain
    label = f"{measured_stats['precision']} step with activation stats vs without, s"
    rows.append((label, hot, plain, hot / plain, None, None))
    targets.append(f"target: activation stats every {interval} steps (the default) cost "
                   f"< 2% of step time: {100 * extra / interval:.3f}% "
                   f"{'PASS' if extra / interval < 0.02 else 'FAIL'} (one activation-stats "
                   f"step costs {100 * extra:.1f}% more than a plain one)")
    notes.append(f"activation stats: {len(measured_stats['plain'])} alternating pairs of "
                 f"{measured_stats['precision']} steps on "
                 "one trainer (per-layer max |attention logit|, max |MLP output|, max "
                 "|residual| on the first micro-batch, per-layer gradient norms)")


def _optimizer_rows(optim: dict, rows: list, notes: list) -> None:
    rates = optim["rates"]
    limit = optim["bandwidth"] / (7 * 4 * optim["numel"])
    rows.append(("AdamW step alone vs stock torch.optim.AdamW, steps/s",
                 median(rates["ours"]), median(rates["torch default"]),
                 ratio(rates["ours"], rates["torch default"]), limit,
                 median(rates["ours"]) / limit))
    notes.append(f"optimizer: ours = build_optimizer (AdamW fused=True), baseline = "
                 f"torch.optim.AdamW with torch's choice of implementation (a per-tensor loop "
                 f"on CPU), as in the {HF} step; fused=True: {median(rates['fused']):,.1f} "
                 f"steps/s ({ratio(rates['fused'], rates['ours']):.2f}x ours); limit: "
                 f"{7 * 4 * optim['numel'] / 1e6:,.0f} MB of fp32 traffic per step at "
                 f"{optim['bandwidth'] / 1e9:.1f} GB/s (a 256 MiB tensor copy)")


def _loader_rows(loader: dict, results: dict, rows: list, targets: list, notes: list) -> None:
    plain = loader["plain"]
    rows.append(("loader (2 workers) vs in-process train[i], samples/s",
                 median(loader["loader"]), median(plain), ratio(loader["loader"], plain),
                 2 * median(plain), median(loader["loader"]) / (2 * median(plain))))
    if results:  # against the fastest precision measured: the hungriest consumer
        fastest = max(results, key=lambda p: median(results[p]["rates"]["ours"]))
        consumed = [r / SEQ for r in results[fastest]["rates"]["ours"]]
        need = median(consumed)
        gain = median(loader["loader"]) / need
        rows.append((f"loader vs our {fastest} step's consumption, samples/s",
                     median(loader["loader"]), need, gain, None, None))
        targets.append(f"target: loader >= 20x what the model consumes: {gain:,.0f}x "
                       f"{'PASS' if gain >= 20 else 'FAIL'}")
    notes.append(f"loader: {loader['samples']:,} samples of the demo train split "
                 f"({loader['split']:,} samples of L = {SEQ}) per round, micro-batches of "
                 f"{MBS}; first batch after {median(loader['startup']):.2f} s (median, "
                 f"not in the rate); other processes "
                 f"{statistics.mean(loader['others']):.2f} cores on average")


def _print_rows(rows: list) -> None:
    header = (f"{'measurement':<56} {'ours':>13} {HF + '/baseline':>24} {'ratio':>8} "
              f"{'limit':>13} {'ours/limit':>10}")
    print_table(header, (
        f"{label:<56} {number(ours)} {number(base, 24)} "
        f"{cell(gain, '>7,.2f', 7)}{'x' if gain is not None else ' '} "
        f"{number(limit)} {cell(vs_limit, '>10.2f', 10)}"
        for label, ours, base, gain, limit, vs_limit in rows))


def report(measured: dict) -> int:
    """Print the table, the notes, the load warning and the targets of ``measure``'s dict."""
    args, results, skipped = measured["args"], measured["results"], measured["skipped"]
    flops = trainer_config("bf16").model.flops_per_token(SEQ)
    rows: list = []  # (label, ours, baseline, ratio, limit, ours/limit)
    targets: list[str] = []
    notes: list[str] = []
    _step_rows(results, flops, rows, targets, notes)
    if measured.get("dp_engines"):
        dp_rows(measured["dp_engines"], flops, rows, notes)
    if measured["activation_stats"]:
        _activation_stats_rows(measured["activation_stats"], rows, targets, notes)
    _optimizer_rows(measured["optim"], rows, notes)
    if measured["loader"]:
        _loader_rows(measured["loader"], results, rows, targets, notes)
    _print_rows(rows)
    print(f"model: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, vocabulary {VOCAB}, "
          f"{trainer_config('bf16').model.num_parameters():,} parameters; micro-batch {MBS} x "
          f"L {SEQ}; {flops / 1e6:.1f} MFLOP per token (forward + backward). Medians of "
          f"{args.rounds} rounds of {args.steps} steps per contestant after {args.warmup} "
          "warm-up steps; ratio: the median of per-round ratios (ours / baseline); limit of a "
          "step: matmul peak / FLOPs per token (ours/limit = MFU); limit of the loader: two "
          "in-process loops (2 cores).")
    if measured.get("dp_engines"):
        dp_table(measured["dp_engines"], notes)
    for note in notes:
        print(note)
    busy = max([max(res["others"]) for res in results.values()]
               + ([measured["dp_engines"]["other"]] if measured.get("dp_engines") else []))
    if busy > 0.25:
        print(f"warning: other processes took up to {busy:.2f} cores during a round: the "
              "absolute rates are low and the ratios noisier than usual; rerun when idle")
    print(load_average("after"))
    for precision, reason in skipped.items():
        targets.insert(0, f"target: ours/{HF} >= 1.2x in {precision}: not measured ({reason})")
    for line in targets:
        print(line)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per precision")
    parser.add_argument("--steps", type=int, default=3, help="steps per contestant per round")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per contestant")
    parser.add_argument("--loader-samples", type=int, default=4096)
    parser.add_argument("--loader-rounds", type=int, default=3)
    parser.add_argument("--corpus", default=str(REPO / "build" / "demo" / "corpus"))
    parser.add_argument("--compile", action="store_true",
                        help="also time ours with torch.compile (train.compile = true)")
    parser.add_argument("--diagnose", action="store_true",
                        help="also time ours with model.attention = sdpa")
    parser.add_argument("--default-malloc", dest="tune_malloc", action="store_false",
                        help="keep glibc's malloc defaults (for every contestant)")
    parser.add_argument("--skip-hf", dest="with_hf", action="store_false",
                        help="ours only (no transformers baseline)")
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--dp", type=int, default=2,
                        help="processes of the ZeRO engines' rows (gloo, one thread each)")
    parser.add_argument("--skip-dp", action="store_true",
                        help="leave out the ZeRO engines' rows at dp > 1")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2 rounds of 1 step, 1 warm-up step, "
                             "1024 loader samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 1, 1
        args.loader_samples, args.loader_rounds = 1024, 1
    args.warmup = max(args.warmup, 1)
    return args


def _skipped_precisions(precisions: list[str]) -> dict[str, str]:
    skipped = {}
    for precision in precisions:
        if precision != "fp32" and not fast_low_precision(precision, torch.device("cpu")):
            skipped[precision] = (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no "
                                  f"oneDNN {precision} path: its matmuls run ~100x slower than "
                                  "fp32 for both contestants")
            print(f"{precision}: skipped: {skipped[precision]}", flush=True)
    return skipped


def measure(args: argparse.Namespace) -> dict:
    """Every measurement of the run (progress and the machine header printed as it goes):
    ``{"args", "results": {precision: rounds}, "skipped", "activation_stats", "optim",
    "loader", "dp_engines"}``."""
    if args.with_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print(f"{HF} is not installed: ours only")
            args.with_hf = False
    warnings.filterwarnings("ignore")
    TUNE_MALLOC[0] = args.tune_malloc
    if args.tune_malloc:
        tune_malloc()  # process-wide: every contestant runs with it
    print(machine_report(*([f"{HF} {version(HF)}"] if args.with_hf else [])), flush=True)
    threshold = "1 GiB (bloomline.trainer.malloc)" if args.tune_malloc else "glibc's default"
    print(f"malloc mmap threshold: {threshold}", flush=True)
    generator = torch.Generator().manual_seed(SEED)
    tokens = random_tokens(generator)
    precisions = args.precisions.split(",")
    skipped = _skipped_precisions(precisions)
    results = {precision: measure_steps(precision, args, tokens)
               for precision in precisions if precision not in skipped}
    dp_engines = None
    if not args.skip_dp and args.dp > 1:
        dp_engines = measure_dp_engines(
            args, [p for p in precisions if p not in skipped], results)
    activation_stats = None
    if results:  # the recipe's bf16 where it runs, else what did
        activation_stats = measure_activation_stats(args, tokens, "bf16" if "bf16" in results
                                      else next(iter(results)))
    optim = measure_optimizer(args)
    loader = None if args.skip_loader else measure_loader(args)
    return {"args": args, "results": results, "skipped": skipped,
            "activation_stats": activation_stats, "optim": optim, "loader": loader,
            "dp_engines": dp_engines}


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
