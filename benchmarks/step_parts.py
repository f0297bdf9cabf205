"""Where our training step's time goes on this CPU: its matmul-only ceiling, and what each
non-matmul part costs inside the real step. The companion of ``benchmarks.train`` (the same
model, batch and ``Trainer`` from ``harness.train_setup``), for whoever chases its 1.2x target.

(1) Matmul ceiling: every matmul of one step of ours, timed alone at its shape and dtype
    (median of 5 runs of 10) and summed: per layer the QKV, attention-output, fc1 and fc2
    products (forward, input gradient, weight gradient) and attention's two batched products
    (forward and two backward each); once the tied head's three. The linear products run
    where the step runs them (in fp32 on ``kernels/cpu/linear.py``'s choice for this CPU). Reported
    as tokens/s were the step nothing but these matmuls, next to the 1024^3 matmul peak
    ``benchmarks.train`` divides by (its "limit"), and the real step measured in the same run.
(2) In-situ costs: one ``Trainer`` runs the real step and the same step with one part taken
    out (its results are wrong; only the time counts), alternating which goes first, for
    ``--pairs`` pairs after warm-up; reported: the mean time saved per step +- its standard
    error, and its share of the real step. Paired steps share the machine's state of the
    moment, so the drift of a shared machine cancels out; isolated micro-benchmarks of the
    same parts misled (``benchmarks/results/step_parts.md`` has the case). The parts:
      gelu       the MLP's tanh-GELU (replaced by the identity);
      softmax    attention's bias add and softmax, forward and backward, in the core of
                 ``kernels/cpu/attention_core.py`` (the scores pass through);
      layernorm  every LayerNorm (replaced by a cast to the compute dtype);
      head loop  the fused head's fp32 log-sum-exp, loss and gradient loop (``model/loss.py``:
                 only its three matmuls remain).
(3) What our kernels save against what they replaced, the same paired way, the replacement
    running in the "without" step (the row reports its extra time, so positive = ours saves):
      aten gelu    ATen's tanh-form GELU instead of ``kernels/cpu/gelu.py``'s compiled sigmoid form;
      fp32 scores  attention scores upcast to fp32 before the bias and softmax (and the
                   probabilities cast back) instead of staying bf16 on CPU (a no-op in fp32);
                   an fp32 bias also sends attention down the autograd path (next rows);
      other linears the linear layers' and the head's fp32 products on the backend
                   ``cpu_fp32_matmul = "auto"`` did not choose for this CPU (oneDNN on
                   Intel, ATen's MKL sgemm on AMD; ``kernels/cpu/linear.py``): what that choice
                   saves. A no-op in bf16, whose products ATen already runs on oneDNN.
      autograd core attention's core as autograd over views instead of the hand-written
                   node of ``kernels/cpu/attention_core.py`` (layout copies; in fp32 also the
                   subnormal probabilities it floors).

Run: ``make bench-step-parts`` or ``python -m benchmarks.step_parts [--pairs N]`` (run time
and results: ``benchmarks/results/step_parts.md``, ``results/bench_step_parts.txt``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from benchmarks.harness import train_setup as bt  # the same model, batch and Trainer config
from benchmarks.harness.machine import machine_report
from benchmarks.harness.table import print_table
from bloomline.trainer.kernels.cpu import attention_core, gelu
from bloomline.trainer.kernels.cpu import linear as linear_layers
from bloomline.trainer.loop import Trainer
from bloomline.trainer.malloc import tune_malloc
from bloomline.trainer.model import attention, gpt, layers, loss
from bloomline.trainer.precision import fast_low_precision
from bloomline.trainer.reporting.mfu import measure_peak_flops

__all__ = ["main", "measure", "report"]

TOKENS = bt.MBS * bt.SEQ


def median_seconds(fn: Callable[[], object], repeats: int = 5, calls: int = 10) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls)
    return statistics.median(runs)


def matmul_ceiling(dtype: torch.dtype) -> float:
    """Seconds per step spent in its matmuls alone (see the module docstring)."""
    h, heads, seq = bt.HIDDEN, bt.HEADS, bt.SEQ
    head_dim = h // heads
    total = 0.0

    def linear(n_in: int, n_out: int, rows: int = TOKENS) -> float:
        x, w = torch.randn(rows, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype)
        grad = torch.randn(rows, n_out, dtype=dtype)
        return (median_seconds(lambda: linear_layers.linear(x, w))
                + median_seconds(lambda: linear_layers.matmul_2d(grad, w))
                + median_seconds(lambda: linear_layers.linear_weight_grad(grad, x)))

    for n_in, n_out in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)):
        total += bt.LAYERS * linear(n_in, n_out)
    batch = bt.MBS * heads
    q = torch.randn(batch, seq, head_dim, dtype=dtype)
    k = torch.randn(batch, seq, head_dim, dtype=dtype)
    probs = torch.randn(batch, seq, seq, dtype=dtype)
    scores = median_seconds(lambda: q @ k.transpose(1, 2))  # [L, d] x [d, L]
    mixing = median_seconds(lambda: probs @ q)  # [L, L] x [L, d]
    total += bt.LAYERS * 3 * (scores + mixing)  # each: forward and two backward products
    return total + linear(h, bt.VOCAB)


@contextmanager
def patched(owner, name: str, replacement):
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _mlp_without_gelu(self, x):
    return self.dense_4h_to_h(self.dense_h_to_4h(x))


@contextmanager
def _attention_without_softmax():
    """The core's bias add and softmax forward and backward skipped: scores pass through."""
    with patched(attention_core, "attention_probabilities", lambda scores, bias: scores), \
            patched(attention_core, "attention_probabilities_backward", lambda grad, _: grad):
        yield


def _layernorm_as_cast(self, x):
    return x.to(layers.compute_dtype(self.weight))


def _head_matmuls_only(ctx, hidden, weight, labels, rows=False):
    logits = hidden @ weight.t()
    ctx.save_for_backward(logits.t() @ hidden, logits @ weight)
    # (mean loss, row losses): LinearCrossEntropy.forward's outputs
    return logits[0, 0].float() * 0.0 + 1.0, hidden.new_empty(0, dtype=torch.float32)


def _upcast_softmax_dtype(compute, device, fp32):
    return torch.float32 if fp32 else compute


@contextmanager
def _other_linears():
    chosen = linear_layers.onednn_linear_enabled()
    linear_layers.set_onednn_linear(not chosen)
    try:
        yield
    finally:
        linear_layers.set_onednn_linear(chosen)


# replacements by what ran before: the time "without" ours is the replacement's
ALTERNATIVES = {
    "aten gelu": lambda: patched(gpt, "bloom_gelu", gelu.gelu_reference),
    "fp32 scores": lambda: patched(attention, "softmax_dtype", _upcast_softmax_dtype),
    "other linears": _other_linears,
    "autograd core": lambda: patched(attention, "uses_core", lambda *_: False),
}

PARTS = {
    "gelu": lambda: patched(gpt.MLP, "forward", _mlp_without_gelu),
    "softmax": _attention_without_softmax,
    "layernorm": lambda: patched(layers.LayerNorm, "forward", _layernorm_as_cast),
    "head loop": lambda: patched(loss.LinearCrossEntropy, "forward",
                                 staticmethod(_head_matmuls_only)),
}


def in_situ_cost(trainer: Trainer, tokens: torch.Tensor, part: str,
                 pairs: int) -> tuple[float, float, float]:
    """(mean seconds saved per step, its standard error, median real step seconds)."""
    def step(without: bool) -> float:
        start = time.perf_counter()
        if without:
            with {**PARTS, **ALTERNATIVES}[part]():
                trainer.train_step([tokens], bt.LR)
        else:
            trainer.train_step([tokens], bt.LR)
        return time.perf_counter() - start

    for without in (False, True, False, True):  # warm-up of both variants
        step(without)
    saved, real = [], []
    for index in range(pairs):
        order = (False, True) if index % 2 == 0 else (True, False)
        times = {without: step(without) for without in order}
        saved.append(times[False] - times[True])
        real.append(times[False])
    return statistics.mean(saved), statistics.stdev(saved) / math.sqrt(pairs), \
        statistics.median(real)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--pairs", type=int, default=30, help="paired steps per part")
    parser.add_argument("--parts", default=",".join([*PARTS, *ALTERNATIVES]))
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """``{"pairs", "precisions": {precision: {"step", "ceiling", "peak", "flops", "costs":
    {part: (mean saved s, standard error, median real step s)}}}}``; a precision the CPU has
    no fast path for is left out (with a printed line)."""
    tune_malloc()
    print(machine_report())
    torch.manual_seed(bt.SEED)
    tokens = bt.random_tokens()
    measured = {}
    for precision in args.precisions.split(","):
        if precision == "bf16" and not fast_low_precision("bf16", torch.device("cpu")):
            print("bf16: skipped, this CPU has no oneDNN bf16 path (AVX-512)")
            continue
        dtype = bt.DTYPES[precision]
        trainer = Trainer(bt.trainer_config(precision), log=lambda *_: None)
        costs = {part: in_situ_cost(trainer, tokens, part, args.pairs)
                 for part in args.parts.split(",")}
        measured[precision] = {
            "costs": costs, "step": statistics.median(real for _, _, real in costs.values()),
            "ceiling": matmul_ceiling(dtype),
            "peak": measure_peak_flops(torch.device("cpu"), dtype),
            "flops": bt.trainer_config(precision).model.flops_per_token(bt.SEQ)}
    return {"pairs": args.pairs, "precisions": measured}


def report(measured: dict) -> int:
    """Print the table of ``measure``'s dict and what its columns mean."""
    rows = []
    for precision, got in measured["precisions"].items():
        step, ceiling = got["step"], got["ceiling"]
        rows.append((f"{precision} step, tokens/s (real: median over the pairs)",
                     f"{TOKENS / step:,.0f}", f"{TOKENS / ceiling:,.0f}",
                     f"{ceiling / step:.2f}", f"{got['peak'] / got['flops']:,.0f}"))
        for part, (saved, error, _) in got["costs"].items():
            label = "ms per step" if part in PARTS else "ms ours saves per step"
            if part in ALTERNATIVES:
                saved = -saved  # the replacement's extra time
            rows.append((f"{precision} {part}, {label}",
                         f"{saved * 1e3:.1f} +- {error * 1e3:.1f}", f"{step * 1e3:.0f}",
                         f"{saved / step:.1%}", "-"))
    widths = (52, 16, 12, 8, 10)

    def line(cells) -> str:
        return "".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                       for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    print_table(line(("measurement", "ours", "baseline", "ratio", "limit")), map(line, rows))
    print("step row: ours = the real step; baseline = the matmul-only ceiling (every matmul "
          "of the step alone at its shape); ratio = ceiling time / real time; limit = the "
          "1024^3 matmul peak over the model's FLOPs per token (benchmarks.train's limit).")
    print("part rows: ours = mean time the part costs inside the step +- standard error over "
          f"{measured['pairs']} paired steps; baseline = the real step, ms; ratio = the part's "
          "share; 'saves' rows: the replacement's extra time (positive: ours is faster).")
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
