"""What a checkpoint costs the training: the stall of a synchronous save against an async one,
the async save's time to complete, and the steps' slowdown while it is written.

The state: a bloomline GPT (``build_model``; vocabulary 32768, hidden 1024, 8 layers, 16
heads: 134M parameters) with fp32 weights and ``build_optimizer``'s AdamW after one step on
random gradients (two fp32 moments per parameter): ~1.6 GB, one process, no process group,
saved into a temporary folder on the local disk. Measured, per round:

  (a) ``dcp.save`` of the same state dict alone: what a save cost before manifests (the
      baseline for the manifest's overhead);
  (b) ``save_checkpoint``: the sync save (DCP write + small files + sha256 of every file +
      manifest + fsyncs + rename): the training stalls for all of it (the baseline of the
      async save);
  (c) ``AsyncCheckpointer.save``: the stall, until ``save()`` returns (the state copied to
      host memory), and the time until ``wait()`` returns (the checkpoint complete), with
      the training thread idle;
  (d) training steps (micro-batch 2 x L 128, forward + backward + AdamW step) without a save
      in flight, then right after ``AsyncCheckpointer.save`` until the save completes:
      the mean step time of each and their ratio (on 2 cores, the background write and
      hashing take CPU from the steps).

Physical limits, measured in the same round: the disk's write bandwidth (the checkpoint's
byte count written with plain ``write`` calls from one buffer, then ``fsync``), which bounds
(a)-(c)'s complete times; the memory bandwidth of copying the state into preallocated
tensors, which bounds the async stall (the staging copy; DCP's copy allocates fresh host
memory, so page faults come on top); and sha256 on one core (``hashlib``), the manifest's
hashing. Each round runs everything once (the sync and the idle async save in alternating
order); medians over rounds are reported, ratios taken within a round, because the machine's
disk and CPU are shared and drift (``benchmarks/results/checkpoint.md`` has how much).

Run: ``make bench-checkpoint`` or ``python -m benchmarks.checkpoint [--rounds N] [--quick]``
(``--quick``: a 4-layer hidden-512 model, one round). Writes
``benchmarks/results/bench_checkpoint.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.harness.machine import OtherLoad, header_line, machine_report
from benchmarks.harness.paths import REPO
from bloomline.trainer.checkpoint import save_checkpoint, saved_state_dict
from bloomline.trainer.checkpoint.async_save import AsyncCheckpointer
from bloomline.trainer.config import Config, OptimizerConfig
from bloomline.trainer.model import build_model
from bloomline.trainer.model.config import ModelConfig
from bloomline.trainer.optim import build_optimizer

__all__ = ["main", "measure", "report"]

SHAPES = {"default": dict(vocab_size=32768, hidden_size=1024, num_layers=8, num_heads=16),
          "quick": dict(vocab_size=8192, hidden_size=512, num_layers=4, num_heads=8)}
MBS, SEQ = 2, 128
CHUNK = 8 << 20


def build_state(shape: dict) -> tuple[torch.nn.Module, torch.optim.Optimizer, ModelConfig]:
    """The model and an AdamW with its moments filled (one step on random gradients)."""
    cfg = ModelConfig(**shape)
    model = build_model(cfg, "cpu", seed=0)
    optimizer = build_optimizer(model, OptimizerConfig())
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, cfg


def state_bytes(model, optimizer) -> int:
    state = saved_state_dict(model, optimizer)
    return sum(v.numel() * v.element_size() for part in state.values()
               for v in part.values() if torch.is_tensor(v))


def train_step(model, optimizer, tokens: torch.Tensor) -> float:
    start = time.perf_counter()
    model(tokens[:, :-1], labels=tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def disk_write_seconds(folder: Path, num_bytes: int) -> float:
    """Plain writes of ``num_bytes`` from one 8 MiB buffer, then fsync: the disk's limit."""
    buffer = os.urandom(CHUNK)
    path = folder / "limit.bin"
    start = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(num_bytes // CHUNK):
            fh.write(buffer)
        fh.write(buffer[: num_bytes % CHUNK])
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def copy_seconds(model, optimizer) -> float:
    """Copying every tensor of the state into preallocated ones: the staging copy's limit."""
    state = saved_state_dict(model, optimizer)
    tensors = [v for part in state.values() for v in part.values() if torch.is_tensor(v)]
    targets = [torch.empty_like(t) for t in tensors]
    for target, tensor in zip(targets, tensors, strict=True):  # touch the pages first
        target.copy_(tensor)
    start = time.perf_counter()
    for target, tensor in zip(targets, tensors, strict=True):
        target.copy_(tensor)
    return time.perf_counter() - start


def sha256_rate() -> float:
    data = os.urandom(256 << 20)
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return len(data) / (time.perf_counter() - start)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def one_round(model, optimizer, config: Config, tokens: torch.Tensor, work: Path,
              num_bytes: int, steps: int, odd_round: bool) -> dict:
    import torch.distributed.checkpoint as dcp

    r: dict = {}
    load = OtherLoad().start()
    r["disk_limit"] = disk_write_seconds(work, num_bytes)
    r["copy_limit"] = copy_seconds(model, optimizer)
    raw = work / "raw"
    start = time.perf_counter()
    dcp.save(saved_state_dict(model, optimizer), checkpoint_id=str(raw))
    r["dcp_raw"] = time.perf_counter() - start
    r["bytes"] = folder_bytes(raw)
    shutil.rmtree(raw)
    state = {"step": 1}

    def sync_save() -> None:
        start = time.perf_counter()
        path = save_checkpoint(work / "sync", 1, model, optimizer, state, config, keep_last=1)
        r["sync"] = time.perf_counter() - start
        shutil.rmtree(path.parent.parent)

    def async_save_idle(saver: AsyncCheckpointer) -> None:
        start = time.perf_counter()
        saver.save(1, model, optimizer, state, config)
        r["async_stall"] = time.perf_counter() - start
        saver.wait()
        r["async_total"] = time.perf_counter() - start
        shutil.rmtree(work / "async")

    with AsyncCheckpointer(work / "async", keep_last=1) as saver:
        # the disk's speed drifts as the host flushes what earlier saves wrote: alternate
        # which of the two goes first
        if odd_round:
            async_save_idle(saver)
            sync_save()
        else:
            sync_save()
            async_save_idle(saver)
        r["step_alone"] = statistics.mean(train_step(model, optimizer, tokens)
                                          for _ in range(steps))
        start = time.perf_counter()
        saver.save(2, model, optimizer, state, config)
        stall = time.perf_counter() - start
        during = []
        while saver.in_flight:
            during.append(train_step(model, optimizer, tokens))
        saver.wait()
        r["busy_total"] = time.perf_counter() - start
        r["busy_stall"] = stall
        r["step_during"] = statistics.mean(during) if during else float("nan")
        r["steps_during"] = len(during)
        shutil.rmtree(work / "async")
    r["other_cores"] = load.cores()
    return r


def median(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def ratio(rounds: list[dict], num: str, den: str) -> float:
    return statistics.median(r[num] / r[den] for r in rounds)


def format_report(rounds: list[dict], params: int, sha_rate: float, header: str) -> str:
    """The result text: ``header``, the state and limits, the table and the derived lines."""
    gb = median(rounds, "bytes") / 1e9
    disk_bw = gb / median(rounds, "disk_limit")
    copy_bw = gb / median(rounds, "copy_limit")
    rows = [
        ("sync save (training stalls), s", median(rounds, "sync"), "dcp.save alone",
         median(rounds, "dcp_raw"), ratio(rounds, "sync", "dcp_raw"),
         median(rounds, "disk_limit"), ratio(rounds, "disk_limit", "sync")),
        ("async save: stall until save() returns, s", median(rounds, "async_stall"),
         "sync save", median(rounds, "sync"), ratio(rounds, "async_stall", "sync"),
         median(rounds, "copy_limit"), ratio(rounds, "copy_limit", "async_stall")),
        ("async save: until complete (idle), s", median(rounds, "async_total"), "sync save",
         median(rounds, "sync"), ratio(rounds, "async_total", "sync"),
         median(rounds, "disk_limit"), ratio(rounds, "disk_limit", "async_total")),
        ("async save: until complete (training), s", median(rounds, "busy_total"),
         "sync save", median(rounds, "sync"), ratio(rounds, "busy_total", "sync"),
         median(rounds, "disk_limit"), ratio(rounds, "disk_limit", "busy_total")),
        ("step time during an async save, s", median(rounds, "step_during"),
         "no save", median(rounds, "step_alone"), ratio(rounds, "step_during", "step_alone"),
         None, None),
    ]
    lines = [header, "",
             f"state: {params / 1e6:.0f}M parameters, fp32 weights + AdamW moments, "
             f"{gb:.2f} GB on disk; {len(rounds)} round(s), medians; micro-batch {MBS} x L {SEQ}",
             f"limits: disk write {disk_bw:.2f} GB/s (plain writes + fsync), state copy "
             f"{copy_bw:.1f} GB/s (into preallocated tensors), sha256 {sha_rate / 1e9:.2f} "
             "GB/s on one core",
             "",
             f"{'measurement':44} {'ours':>8}  {'baseline':18} {'value':>8} {'ratio':>7} "
             f"{'limit':>8} {'limit/ours':>10}",
             "-" * 110]
    for name, ours, base_name, base, rat, limit, frac in rows:
        limit_cell = f"{limit:8.2f}" if limit is not None else f"{'-':>8}"
        frac_cell = f"{frac:10.2f}" if frac is not None else f"{'-':>10}"
        lines.append(f"{name:44} {ours:8.2f}  {base_name:18} {base:8.2f} {rat:6.2f}x "
                     f"{limit_cell} {frac_cell}")
    steps = ", ".join(str(r["steps_during"]) for r in rounds)
    others = max(r["other_cores"] for r in rounds)
    stall = median(rounds, "async_stall") + (median(rounds, "step_during")
                                             - median(rounds, "step_alone")) * statistics.median(
        r["steps_during"] for r in rounds)
    lines += ["",
              f"steps trained while the async save was in flight, per round: {steps}",
              f"training time an async save costs (stall + slower steps): {stall:.2f} s, "
              f"{stall / median(rounds, 'sync'):.2f}x the sync save's stall",
              f"manifest overhead (sha256 of every file, fsyncs): sync save / dcp.save = "
              f"{ratio(rounds, 'sync', 'dcp_raw'):.2f}x; hashing alone would take "
              f"{median(rounds, 'bytes') / sha_rate:.2f} s",
              f"other processes kept up to {others:.2f} cores busy during a round"
              + (" (WARNING: shared machine, timings noisy)" if others > 0.25 else "")]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps timed without a save")
    parser.add_argument("--quick", action="store_true", help="small model, one round")
    parser.add_argument("--out", default="benchmarks/results/bench_checkpoint.txt",
                        help="result file, relative to the repository ('' : none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    return args


def measure(args: argparse.Namespace) -> dict:
    """Every round (``one_round``'s dicts) with the state's size, sha256's rate and the lines
    printed meanwhile (the result file repeats them): ``{"rounds", "params", "sha_rate",
    "printed", "started", "out"}``."""
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    printed = [machine_report(header=False)]  # the result file repeats what the run printed
    print(printed[0], flush=True)
    model, optimizer, model_cfg = build_state(SHAPES["quick" if args.quick else "default"])
    config = Config()
    config.model = model_cfg
    tokens = torch.randint(0, model_cfg.vocab_size, (MBS, SEQ + 1),
                           generator=torch.Generator().manual_seed(0))
    train_step(model, optimizer, tokens)  # warm-up
    num_bytes = state_bytes(model, optimizer)
    sha_rate = sha256_rate()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint.") as tmp:
        for index in range(args.rounds):
            work = Path(tmp) / f"round{index}"
            work.mkdir()
            rounds.append(one_round(model, optimizer, config, tokens, work, num_bytes,
                                    args.steps, odd_round=index % 2 == 1))
            r = rounds[-1]
            printed.append(f"round {index + 1}/{args.rounds}: dcp.save {r['dcp_raw']:.2f} s, "
                           f"sync {r['sync']:.2f} s, async stall {r['async_stall']:.2f} s / "
                           f"complete {r['async_total']:.2f} s, disk limit "
                           f"{r['disk_limit']:.2f} s; steps {r['step_alone']:.2f} s alone, "
                           f"{r['step_during']:.2f} s during a save ({r['steps_during']}); "
                           f"other processes {r['other_cores']:.2f} cores")
            print(printed[-1], flush=True)
    return {"rounds": rounds, "params": model_cfg.num_parameters(), "sha_rate": sha_rate,
            "printed": printed, "started": started, "out": args.out}


def report(measured: dict) -> int:
    """Print the result text and write it to ``--out`` (relative to the repository)."""
    header = header_line(f"torch {torch.__version__}", started=measured["started"])
    text = format_report(measured["rounds"], measured["params"], measured["sha_rate"],
                         "\n".join([header, *measured["printed"]]))
    print(text)
    if measured["out"]:
        out = REPO / measured["out"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
