"""Training-step throughput of ``Trainer.train_step`` against transformers' BloomForCausalLM,
and the data loader against what the model consumes.

One model shape for both (6 layers, hidden 384, 6 heads, vocabulary 8064 = 8000 padded to a
multiple of 128, no dropout, tied embeddings: 13.7M parameters), micro-batch 8 of L = 256
tokens, the same batch of random token ids (< 8000) every step, on CPU:

  (a) ours: ``bloomline.trainer.loop.Trainer`` built from a ``Config`` with that model (no
      data is opened), and ``trainer.train_step([tokens], lr)`` with ``tokens`` [8, 257]
      int64: exactly what the training loop runs per step (forward under the precision
      policy, the LM head fused with the fp32 cross-entropy (``model/loss.py``: no fp32
      logits), backward, clip to 1.0, ``build_optimizer``'s AdamW step, zero_grad);
  (b) transformers: ``BloomForCausalLM(BloomConfig(...))`` with fp32 parameters, a stock
      ``torch.optim.AdamW`` with the same lr 3e-4, betas (0.9, 0.95), eps 1e-8 and weight
      decay groups (0.1 on matrices, none on biases and LayerNorms; torch chooses the
      implementation), ``labels=input_ids`` on the first 256 tokens (it shifts inside),
      ``loss.backward()``, ``clip_grad_norm_(1.0)``, ``optimizer.step()``, ``zero_grad``.
      Both run the model on 256 tokens per sample;
  in two precisions: ``bf16`` (fp32 master weights, forward under
  ``torch.autocast('cpu', bfloat16)``: ours is ``precision.dtype = "bf16"``) and ``fp32``.
  Ours runs ``model.attention = "auto"`` (eager on CPU). ``--compile`` adds ours with
  ``train.compile = true`` (skipped, with the reason, if compiling fails; its warm-up step
  times show the compiles). ``--diagnose`` adds ours with ``model.attention = "sdpa"`` (the
  fused CPU SDPA kernel with the ALiBi bias as a [1, heads, L, L] mask), to show why auto
  picks eager on CPU.

The process runs with glibc's mmap threshold raised to 1 GiB (``bloomline.trainer.malloc``,
what ``Trainer`` does by default): process-wide, so the transformers baseline gets the same
allocator. ``--default-malloc`` leaves glibc's defaults for both, to measure that effect.

Each precision warms every contestant up (``--warmup`` steps), then runs ``--rounds`` rounds of
``--steps`` steps per contestant, the order reversed every round; tokens/s is taken per round,
each ratio within a round and the median over rounds reported, because this 2-core machine is
shared and its speed drifts from one minute to the next. The limit of a step is the matmul
peak (``measure_peak_flops``: the best of ~20 ms tries of 1024^3 matmuls in that dtype, in
fp32 the faster of ATen's MKL product and oneDNN's, taken once per round, the highest used)
over the model FLOPs per token (``ModelConfig.flops_per_token(256)``, forward + backward,
Megatron's count): ours/limit is the MFU. The losses of the first and last step are printed
to show that both train on the same problem.

The optimizer step alone (random gradients on our model's parameters): ours
(``build_optimizer``) against the stock ``torch.optim.AdamW`` of the transformers step, and
``fused=True`` (what transformers' Trainer picks on torch >= 2.8); limit: AdamW's memory
traffic (read parameter, gradient and two moments, write three: 28 bytes a parameter) at the
bandwidth of a 256 MiB tensor copy.

The loader: the demo corpus (``build/demo/corpus``; made with the dataprep commands of
``make demo`` when missing), ``open_splits(corpus, 256, 20000, None, "98,2,0", 1234, None)``
and ``make_loader(train, MegatronSampler(...), num_workers=2, prefetch_factor=4,
pin_memory=False)``: samples/s in micro-batches of 8 from the first batch on (the worker
start-up is printed apart), over ``--loader-samples`` samples, against a plain in-process loop
stacking ``train[i]`` in the same order (the baseline; two of them, one per core, are the
limit) and against what the model consumes (the samples/s of our fastest measured step;
target >= 20x).

A precision the CPU has no oneDNN kernels for (bf16 without AVX-512: matmuls ~100x slower than
fp32, for both contestants) is skipped with that reason in its target line.

The machine's load is printed: the load averages and busiest processes before the run, and
for every round the cores other processes kept busy meanwhile (/proc/stat minus this
process); a warning follows when that exceeded a quarter of a core.

Run: ``make bench-train`` or ``.venv/bin/python benchmarks/bench_train.py [--quick]
[--compile] [--diagnose]``. The default run takes ~2 minutes on 2 idle cores, ``--quick``
(2 rounds of 1 step) ~20 s; ``--compile`` and ``--diagnose`` add ~1 minute each (twice that
and more when other processes share the cores). Last run: ``results/bench_train.txt``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import torch
from machine import OtherLoad, header_line, load_average, relative

from bloomline.trainer.config import Config
from bloomline.trainer.data import MegatronSampler, make_loader, open_splits
from bloomline.trainer.malloc import tune_malloc
from bloomline.trainer.loop import Trainer
from bloomline.trainer.model import build_model
from bloomline.trainer.optim import build_optimizer
from bloomline.trainer.mfu import measure_peak_flops
from bloomline.trainer.precision import fast_low_precision

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, MBS = 6, 384, 6, 256, 8064, 8
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
DATA_VOCAB = 8000  # the ids drawn: the tokenizer's vocabulary before padding
SEED = 1234
TRAIN_SAMPLES = 20_000  # the demo's train split (make demo builds this many)
REPO = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
HF = "transformers"
COMPILED = "ours, torch.compile"
DIAG_SDPA = "ours, attention=sdpa"
TUNE_MALLOC = [True]  # --default-malloc clears it before any contestant is built


# ----------------------------------------------------------------------------- machine


def machine_report(*extras: str, header: bool = True) -> str:
    """The result header (``machine.header_line``: command, date, commit, CPU model, then
    torch's version and ``extras``; left out with ``header=False``, for a caller that writes
    its own), the load before the run and the busiest other processes."""
    lines = [header_line(f"torch {torch.__version__}", *extras)] if header else []
    lines.append(f"{load_average('before')}; os.cpu_count() = {os.cpu_count()}, torch threads "
                 f"= {torch.get_num_threads()}, CPU capability "
                 f"{torch.backends.cpu.get_cpu_capability()}")
    try:
        top = subprocess.run(["top", "-bn1", "-w", "120"], capture_output=True, text=True,
                             timeout=10).stdout.splitlines()
        busy = [line for line in top[7:] if line.split() and _cpu_of(line) >= 5.0
                and line.split()[0] != str(os.getpid())]
        lines.append("top -bn1, processes above 5% CPU: " +
                     ("; ".join(" ".join(line.split()[i] for i in (0, 8, 11)) for line in busy[:5])
                      or "none"))
    except (OSError, subprocess.SubprocessError):
        pass
    return "\n".join(lines)


def _cpu_of(line: str) -> float:
    try:
        return float(line.split()[8])
    except (IndexError, ValueError):
        return 0.0


# ------------------------------------------------------------------------- contestants


def trainer_config(precision: str, compile_model: bool = False) -> Config:
    cfg = Config()
    model = cfg.model
    model.vocab_size, model.hidden_size = VOCAB, HIDDEN
    model.num_layers, model.num_heads = LAYERS, HEADS
    model.hidden_dropout = model.attention_dropout = 0.0
    cfg.data.tokenizer, cfg.data.seq_length = "", SEQ
    cfg.train.micro_batch_size = cfg.train.global_batch_size = MBS
    cfg.train.device, cfg.train.seed, cfg.train.compile = "cpu", SEED, compile_model
    cfg.train.run_dir = tempfile.gettempdir()  # never written: only train_step runs
    cfg.precision.dtype = precision
    cfg.monitor.tensorboard = False
    opt = cfg.optimizer
    opt.name, opt.lr, (opt.beta1, opt.beta2), opt.eps = "adamw", LR, BETAS, EPS
    opt.weight_decay, opt.clip_grad = WEIGHT_DECAY, CLIP
    return cfg


def ours_step(precision: str, tokens: torch.Tensor, compile_model: bool = False,
              attention: str = "") -> Callable[[], float]:
    cfg = trainer_config(precision, compile_model)
    cfg.model.attention = attention or cfg.model.attention
    cfg.train.tune_malloc = TUNE_MALLOC[0]
    trainer = Trainer(cfg, log=lambda *_: None)
    lr = trainer.cfg.optimizer.lr

    def step() -> float:
        return trainer.train_step([tokens], lr)["loss"]
    return step


def decay_groups(model: torch.nn.Module) -> list[dict]:
    """Weight decay on the matrices only (Linear weights, embedding), as ours."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def hf_step(precision: str, tokens: torch.Tensor) -> Callable[[], float]:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(SEED)
    model = BloomForCausalLM(BloomConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        hidden_dropout=0.0, attention_dropout=0.0)).train()
    # stock torch.optim.AdamW with our hyperparameters (torch picks the implementation)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=LR, betas=BETAS, eps=EPS)
    input_ids = tokens[:, :SEQ]  # labels = input_ids: the model shifts them itself

    def step() -> float:
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=input_ids, labels=input_ids).loss
        else:
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


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


def measure_thermometers(args, tokens: torch.Tensor, precision: str) -> dict:
    """Our step with the thermometers on against the same step without, alternating within
    each round (the same trainer, so the same weights and caches)."""
    cfg = trainer_config(precision)
    trainer = Trainer(cfg, log=lambda *_: None)
    lr = cfg.optimizer.lr
    for _ in range(args.warmup):
        trainer.train_step([tokens], lr, activation_stats=True)
        trainer.train_step([tokens], lr)
    plain, thermo = [], []
    for round_no in range(args.rounds * args.steps):
        order = (False, True) if round_no % 2 == 0 else (True, False)
        for on in order:
            start = time.perf_counter()
            trainer.train_step([tokens], lr, activation_stats=on)
            (thermo if on else plain).append(time.perf_counter() - start)
    return {"plain": plain, "thermo": thermo, "precision": precision}


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


def median(values):
    return statistics.median(values) if values else None


def ratio(numerators, denominators):
    """The median of per-round ratios."""
    pairs = [a / b for a, b in zip(numerators, denominators, strict=True) if b]
    return statistics.median(pairs) if pairs else None


def report(args, results: dict, optim: dict, loader: dict | None,
           thermo: dict | None = None, skipped: dict | None = None) -> int:
    flops = trainer_config("bf16").model.flops_per_token(SEQ)
    rows = []  # (label, ours, baseline, ratio, limit, ours/limit)
    targets, notes = [], []
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
    if thermo:
        plain, hot = median(thermo["plain"]), median(thermo["thermo"])
        interval = Config().monitor.activation_stats_interval
        extra = max(hot - plain, 0.0) / plain
        rows.append((f"{thermo['precision']} step with thermometers vs without, s", hot, plain,
                     hot / plain, None, None))
        targets.append(f"target: thermometers every {interval} steps (the default) cost "
                       f"< 2% of step time: {100 * extra / interval:.3f}% "
                       f"{'PASS' if extra / interval < 0.02 else 'FAIL'} (one thermometer "
                       f"step costs {100 * extra:.1f}% more than a plain one)")
        notes.append(f"thermometers: {len(thermo['plain'])} alternating pairs of "
                     f"{thermo['precision']} steps on "
                     "one trainer (per-layer max |attention logit|, max |MLP output|, max "
                     "|residual| on the first micro-batch, per-layer gradient norms)")
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
    if loader:
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

    def cell(value, fmt, width=13):
        return f"{'-':>{width}}" if value is None or math.isnan(value) else format(value, fmt)

    def number(value, width=13):  # one decimal below 100
        return cell(value, f">{width}{',.1f' if value is not None and value < 100 else ',.0f'}",
                    width)

    header = (f"{'measurement':<56} {'ours':>13} {HF + '/baseline':>24} {'ratio':>8} "
              f"{'limit':>13} {'ours/limit':>10}")
    print()
    print(header)
    print("-" * len(header))
    for label, ours, base, gain, limit, vs_limit in rows:
        print(f"{label:<56} {number(ours)} {number(base, 24)} "
              f"{cell(gain, '>7,.2f', 7)}{'x' if gain is not None else ' '} "
              f"{number(limit)} {cell(vs_limit, '>10.2f', 10)}")
    print(f"model: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, vocabulary {VOCAB}, "
          f"{trainer_config('bf16').model.num_parameters():,} parameters; micro-batch {MBS} x "
          f"L {SEQ}; {flops / 1e6:.1f} MFLOP per token (forward + backward). Medians of "
          f"{args.rounds} rounds of {args.steps} steps per contestant after {args.warmup} "
          "warm-up steps; ratio: the median of per-round ratios (ours / baseline); limit of a "
          "step: matmul peak / FLOPs per token (ours/limit = MFU); limit of the loader: two "
          "in-process loops (2 cores).")
    for note in notes:
        print(note)
    busy = max(max(res["others"]) for res in results.values())
    if busy > 0.25:
        print(f"warning: other processes took up to {busy:.2f} cores during a round: the "
              "absolute rates are low and the ratios noisier than usual; rerun when idle")
    print(load_average("after"))
    for precision, reason in (skipped or {}).items():
        targets.insert(0, f"target: ours/{HF} >= 1.2x in {precision}: not measured ({reason})")
    for line in targets:
        print(line)
    return 0


def main() -> int:
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
    parser.add_argument("--quick", action="store_true",
                        help="a ~30 s smoke run: 2 rounds of 1 step, 1 warm-up step, "
                             "1024 loader samples")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 1, 1
        args.loader_samples, args.loader_rounds = 1024, 1
    args.warmup = max(args.warmup, 1)
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
    tokens = torch.randint(0, DATA_VOCAB, (MBS, SEQ + 1), generator=generator)
    skipped = {}
    for precision in args.precisions.split(","):
        if precision != "fp32" and not fast_low_precision(precision, torch.device("cpu")):
            skipped[precision] = (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no "
                                  f"oneDNN {precision} path: its matmuls run ~100x slower than "
                                  "fp32 for both contestants")
            print(f"{precision}: skipped: {skipped[precision]}", flush=True)
    results = {precision: measure_steps(precision, args, tokens)
               for precision in args.precisions.split(",") if precision not in skipped}
    thermo = None
    if results:  # the recipe's bf16 where it runs, else what did
        thermo = measure_thermometers(args, tokens, "bf16" if "bf16" in results
                                      else next(iter(results)))
    optim = measure_optimizer(args)
    loader = None if args.skip_loader else measure_loader(args)
    return report(args, results, optim, loader, thermo, skipped)


if __name__ == "__main__":
    raise SystemExit(main())
