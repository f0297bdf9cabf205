"""What document masking (``data.reset_attention_mask``, ``data.eod_mask_loss``) costs: the
loader still yields plain token samples at ``get_batch``'s speed, and the step's own work
(document ids, the masked bias or BlockMask) is small beside its attention.

Two parts, each with its baseline and limit in the same run:

- loader (a worker's view): ``get_batch`` of a micro-batch alone (baseline), ``get_batch``
  plus each sample's document ids as a worker would compute them (numpy exclusive cumsum of
  ``tokens == EOD``), and the limit: one contiguous copy of the batch's bytes;
- step (per micro-batch, on this machine's CPU): the document ids (one torch cumsum), the
  eager/sdpa bias with -inf across documents ([b, heads, L, L], ``document_bias``), flex's
  BlockMask (``create_block_mask``), the limit of the bias (writing its bytes once), against
  the step's attention: the eager attention core's forward + backward for one layer with the
  shared causal bias (baseline) and with the per-sample bias, times the layers.

The corpus: uint16 documents of lognormal lengths (mean 500 tokens, ~4 per 2048-token sample),
each ending in EOD, cached in ``benchmarks/.cache/``. The trainer computes the ids in the step
(one cumsum on the device); the loader rows show what computing them in the workers instead
would cost. Run: ``make bench-document-masks`` or ``python -m benchmarks.document_masks
[--quick]``; writes ``benchmarks/results/bench_document_masks.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness.machine import OtherLoad, header_line, machine_report, others_line
from benchmarks.harness.paths import CACHE_DIR
from benchmarks.harness.stats import median, ratio
from benchmarks.harness.table import number, write_result

__all__ = ["main", "measure", "report"]

VOCAB, EOD, MEAN_DOC = 65000, 64999, 500.0


def _corpus(cache: Path, tokens: int) -> Path:
    """A one-dataset corpus of ~``tokens`` tokens, every document ending in EOD (cached)."""
    from bloomline.dataprep import IndexedDatasetWriter

    folder = cache / f"document_masks_{tokens:g}t"
    if (folder / "docs.idx").exists():
        return folder
    rng = np.random.default_rng(7)
    lengths = rng.lognormal(math.log(MEAN_DOC) - 0.5, 1.0, int(tokens / MEAN_DOC))
    lengths = np.maximum(1, lengths.round()).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    with IndexedDatasetWriter(folder / "docs", np.uint16, overwrite=True) as writer:
        body = rng.integers(0, EOD, size=int(lengths.sum()), dtype=np.uint16)
        body[np.cumsum(lengths) - 1] = EOD  # each document's last token
        writer.add_documents(body, lengths)
    return folder


def _samples(args: argparse.Namespace):
    from bloomline.dataprep import IndexRequest, build_sample_datasets

    corpus = _corpus(args.cache_dir, args.tokens)
    request = IndexRequest(seq_length=args.seq_length, train_samples=args.samples,
                           split="1,0,0", seed=1234)
    return build_sample_datasets(corpus, request, cache_dir=corpus / ".index").splits["train"]


def _numpy_ids(batch: np.ndarray) -> np.ndarray:
    """A worker's document ids of a [b, L + 1] batch: exclusive cumsum of EOD inputs."""
    ends = batch[:, :-1] == EOD
    return np.cumsum(ends, axis=1, dtype=np.int32) - ends


def _timed(fn, repeat: int) -> float:
    """Seconds per call of ``fn``, over ``repeat`` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def _loader_round(ds, groups: list[np.ndarray], source: np.ndarray) -> dict:
    """Seconds per micro-batch of each loader contestant, over every group once."""
    copy = np.empty_like(source)
    count = len(groups)

    def get_batch():
        for ids in groups:
            ds.get_batch(ids)

    def with_ids():
        for ids in groups:
            _numpy_ids(ds.get_batch(ids))

    def limit():
        for _ in groups:
            np.copyto(copy, source)

    return {name: _timed(fn, 1) / count for name, fn in
            (("get_batch", get_batch), ("get_batch + ids", with_ids), ("copy limit", limit))}


def _step_inputs(args: argparse.Namespace, ds):
    """One micro-batch's input tokens [b, L], its ids, the shared causal bias and a qkv."""
    from bloomline.trainer.model import alibi_bias, alibi_slopes
    from bloomline.trainer.model.documents import document_ids

    tokens = torch.from_numpy(ds.get_batch(np.arange(args.micro_batch)).astype(np.int64))
    inputs = tokens[:, :-1].contiguous()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    shared = alibi_bias(alibi_slopes(args.heads), args.seq_length, dtype=dtype)
    qkv = torch.randn(args.micro_batch, args.seq_length, 3 * args.heads * args.head_dim,
                      dtype=dtype, requires_grad=True)
    return inputs, document_ids(inputs, EOD), shared, qkv


def _step_round(args: argparse.Namespace, inputs, ids, shared, qkv) -> dict:
    """Seconds per micro-batch of each step contestant (one call each)."""
    from bloomline.trainer.kernels.cpu.attention_core import alibi_attention_core
    from bloomline.trainer.model.documents import (
        document_bias,
        document_block_mask,
        document_ids,
    )

    masked = document_bias(shared, ids)
    out = torch.empty_like(masked)

    def core(bias):
        def run():
            alibi_attention_core(qkv, bias, args.heads).sum().backward()
        return run

    cases = (("document ids", lambda: document_ids(inputs, EOD)),
             ("masked bias", lambda: document_bias(shared, ids)),
             ("bias write limit", lambda: out.fill_(0.0)),
             ("flex BlockMask", lambda: document_block_mask(ids)),
             ("attention 1 layer, shared", core(shared)),
             ("attention 1 layer, masked", core(masked)))
    return {name: _timed(fn, 1) for name, fn in cases}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=20e6, help="corpus size")
    parser.add_argument("--samples", type=int, default=4096, help="samples in the index")
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12, help="attention heads (125m's)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12, help="the step's attention layers")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="L 256, 2 heads, 2 rounds: a smoke run")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--out", default="benchmarks/results/bench_document_masks.txt")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.samples, args.seq_length, args.heads, args.rounds = 2e6, 512, 256, 2, 2
    return args


def measure(args: argparse.Namespace) -> dict:
    """Per round, each contestant's seconds per micro-batch: ``{"loader": [dict],
    "step": [dict], ...}``, the order of the two parts reversed every other round."""
    started = time.perf_counter()
    printed = machine_report(header=False)
    print(printed, flush=True)
    ds = _samples(args)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds))
    groups = [order[i:i + args.micro_batch]
              for i in range(0, len(order) - args.micro_batch + 1, args.micro_batch)]
    source = np.asarray(ds.get_batch(groups[0]))
    step_inputs = _step_inputs(args, ds)
    _loader_round(ds, groups[:4], source)  # untimed: page tables, compiled loops
    _step_round(args, *step_inputs)
    load = OtherLoad().start()
    loader, step = [], []
    for number_ in range(args.rounds):
        parts = [lambda: loader.append(_loader_round(ds, groups, source)),
                 lambda: step.append(_step_round(args, *step_inputs))]
        for part in parts if number_ % 2 == 0 else parts[::-1]:
            part()
    documents = float((_numpy_ids(source)[:, -1] + 1).mean())
    return {"loader": loader, "step": step, "documents": documents, "started": started,
            "printed": printed, "others": load.cores(), "out": args.out,
            "shape": (args.micro_batch, args.seq_length, args.heads, args.head_dim,
                      args.layers, args.dtype), "batch_bytes": source.nbytes}


def _rows(rounds: list[dict], baseline: str, scale: float = 1.0) -> list[str]:
    """One line per contestant: microseconds per micro-batch (median over rounds) and the
    median per-round ratio to ``baseline`` (times ``scale``)."""
    base = [r[baseline] * scale for r in rounds]
    lines = []
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        share = ratio(values, base)
        lines.append(f"{name:28s} {number(median(values) * 1e6)} {number(share * 100)} %")
    return lines


def report(measured: dict) -> int:
    """Print the two tables and write them to ``--out`` (relative to the repository)."""
    mbs, length, heads, head_dim, layers, dtype = measured["shape"]
    lines = [measured["printed"], "",
             f"micro-batch {mbs} x L {length}, ~{measured['documents']:.1f} documents per "
             f"sample; {measured['batch_bytes']:,} bytes per batch", "",
             f"{'loader (one micro-batch)':28s} {'us':>13s} {'of get_batch':>15s}",
             *_rows(measured["loader"], "get_batch"), "",
             f"step ({heads} heads x {head_dim}, {dtype}; {layers} layers)".ljust(28)
             + f" {'us':>13s} {'of attention':>15s}",
             *_rows(measured["step"], "attention 1 layer, shared", layers),
             "(% of attention: of the eager attention core's forward + backward with the "
             f"shared bias, x {layers} layers)"]
    lines.append(others_line(measured["others"]))
    header = header_line(f"torch {torch.__version__}", started=measured["started"])
    print("\n".join([header, *lines]))
    write_result(measured["out"], header, lines)
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
