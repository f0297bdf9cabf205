"""What peer snapshots cost the training, against today's checkpoints of the same state.

Two processes with gloo on this machine, each one "node" (``snapshot_ranks_per_node = 1``:
each keeps its own snapshot and a copy of the other's), each holding the state of a bloomline
GPT (vocabulary 32768, hidden 768, 6 layers: 68M parameters) with fp32 weights and AdamW's
moments after a step: ~0.8 GB per rank. Per round, on both ranks at once:

  (a) ``PeerSnapshots.take``: the training thread's stall (the state copied into the staging
      buffer), then the round's completion in the background with the training thread
      idle (CRC-32, the own file in ``/dev/shm``, the exchange with the peer, its copy
      written, the barrier);
  (b) training steps (micro-batch 2 x L 128) alone, and while a round is in flight: the
      slowdown the background work costs them (2 cores shared by 2 ranks and their rounds);
  (c) a recovery's read: the own file read and checked (CRC) and restored into the model and
      optimizer (``restore_state``);
  (d) baselines, the same state: ``AsyncCheckpointer.save``'s stall and its completion, the
      synchronous ``save_checkpoint`` (both to the local disk, as a run's checkpoints), and
      ``load_checkpoint`` of it (the manifest verified, then DCP): what a restart reads
      without snapshots.

Limits measured in the same run: copying the state into preallocated tensors (the stall's
floor: the staging copy is exactly that) and CRC-32 over the state (zlib, one core).
Medians over rounds.

Run: ``python -m benchmarks.snapshot [--rounds N] [--quick]`` (``--quick``: hidden 256,
2 layers, one round). Writes ``benchmarks/results/bench_snapshot.txt`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.checkpoint import build_state, copy_seconds, state_bytes, train_step
from benchmarks.harness.machine import OtherLoad, header_line, machine_report, others_line
from benchmarks.harness.table import write_result

__all__ = ["main"]

SHAPES = {"default": dict(vocab_size=32768, hidden_size=768, num_layers=6, num_heads=12),
          "quick": dict(vocab_size=8192, hidden_size=256, num_layers=2, num_heads=4)}
MBS, SEQ = 2, 128
WORLD = 2


def _one_round(index, snapshots, saver, model, optimizer, tokens, cfg, work, rank,
               steps) -> dict:
    """One round of measurements (a)-(d) on this rank (see the module docstring)."""
    from bloomline.trainer.checkpoint import load_checkpoint, save_checkpoint
    from bloomline.trainer.snapshots.local_state import restore_state
    from bloomline.trainer.snapshots.shard_file import tensor_views

    r: dict = {"copy_limit": copy_seconds(model, optimizer)}
    dist.barrier()
    start = time.perf_counter()
    snapshots.take(index + 1, {"step": index + 1}, timeline=0)
    r["stall"] = time.perf_counter() - start
    snapshots.wait()
    r["round"] = time.perf_counter() - start
    r["parts"] = dict(snapshots.last_round_parts)
    dist.barrier()
    r["step_alone"] = statistics.mean(train_step(model, optimizer, tokens)
                                      for _ in range(steps))
    dist.barrier()
    snapshots.take(index + 1, {"step": index + 1}, timeline=0)
    during = []
    while snapshots.in_flight and snapshots._round.is_alive():
        during.append(train_step(model, optimizer, tokens))
    snapshots.wait()
    r["step_during"] = statistics.mean(during) if during else float("nan")
    r["steps_during"] = len(during)
    holding = [h for h in snapshots.store.holdings() if h.shard == rank][-1]
    start = time.perf_counter()
    header, data = snapshots.store.read(holding.path)
    restore_state(model, optimizer, tensor_views(data, header.slots), header.values)
    r["recover_read"] = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    saver.save(index + 1, model, optimizer, {"step": index + 1}, cfg)
    r["async_stall"] = time.perf_counter() - start
    saver.wait()
    r["async_total"] = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    path = save_checkpoint(Path(work) / "sync", index + 1, model, optimizer,
                           {"step": index + 1}, cfg, keep_last=1, is_writer=rank == 0)
    r["sync"] = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()  # what a restart reads without snapshots: verify + load
    load_checkpoint(path, model, optimizer)
    r["load"] = time.perf_counter() - start
    return r


def _rank(rank: int, args: argparse.Namespace, port: int, work: str, out) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), TORCHELASTIC_MAX_RESTARTS="1",
                      TORCHELASTIC_RUN_ID="bench")
    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from bloomline.trainer.checkpoint.async_save import AsyncCheckpointer
    from bloomline.trainer.config import Config
    from bloomline.trainer.snapshots.peer_snapshots import PeerSnapshots

    model, optimizer, model_cfg = build_state(SHAPES[args.shape])
    cfg = Config()
    cfg.model = model_cfg
    cfg.checkpoint.snapshot_interval = 1
    cfg.checkpoint.snapshot_ranks_per_node = 1
    cfg.checkpoint.snapshot_dir = args.snapshot_dir
    tokens = torch.randint(0, model_cfg.vocab_size, (MBS, SEQ + 1),
                           generator=torch.Generator().manual_seed(rank))
    train_step(model, optimizer, tokens)
    snapshots = PeerSnapshots(cfg, Path(work) / "run", model, optimizer, rank, WORLD,
                              "bench", log=lambda *_: None)
    saver = AsyncCheckpointer(Path(work) / "async", keep_last=1, is_writer=rank == 0)
    snapshots.take(0, {"step": 0}, timeline=0)  # the first allocates the staging buffer
    snapshots.wait()
    rounds = []
    try:
        for index in range(args.rounds):
            rounds.append(_one_round(index, snapshots, saver, model, optimizer, tokens,
                                     cfg, work, rank, args.steps))
    finally:  # a failed run leaves no snapshot in /dev/shm (its folder is this run's alone)
        snapshots.close(finished=True)
        saver.close()
    if rank == 0:
        data = torch.empty(state_bytes(model, optimizer), dtype=torch.uint8)
        start = time.perf_counter()
        zlib.crc32(memoryview(data.numpy()))
        out.put({"rounds": rounds, "bytes": data.numel(), "crc_seconds":
                 time.perf_counter() - start, "params": model_cfg.num_parameters()})
    dist.destroy_process_group()


def _median(rounds, key):
    return statistics.median(r[key] for r in rounds)


def format_report(m: dict, header: str) -> str:
    rounds, gb = m["rounds"], m["bytes"] / 1e9
    rows = [
        ("snapshot: training stall (take), s", _median(rounds, "stall"),
         "async checkpoint stall", _median(rounds, "async_stall"),
         _median(rounds, "copy_limit"), "state copy"),
        ("snapshot: round complete (idle), s", _median(rounds, "round"),
         "async checkpoint complete", _median(rounds, "async_total"),
         _median(rounds, "copy_limit") * 3 + m["crc_seconds"], "3 copies + CRC"),
        ("recovery: read + check + restore, s", _median(rounds, "recover_read"),
         "checkpoint load (verified)", _median(rounds, "load"),
         _median(rounds, "copy_limit") * 2 + m["crc_seconds"], "2 copies + CRC"),
        ("step during a round, s", _median(rounds, "step_during"),
         "step alone", _median(rounds, "step_alone"), None, ""),
    ]
    lines = [header, "",
             f"state per rank: {m['params'] / 1e6:.0f}M parameters, fp32 weights + AdamW "
             f"moments, {gb:.2f} GB; {WORLD} ranks as 2 nodes, each keeping its own snapshot "
             f"and the other's; {len(rounds)} round(s), medians",
             f"limits: state copy {gb / _median(rounds, 'copy_limit'):.1f} GB/s, CRC-32 "
             f"{gb / m['crc_seconds']:.1f} GB/s (one core)", "",
             f"{'measurement':38} {'ours':>8}  {'baseline':26} {'value':>8} {'ratio':>7} "
             f"{'limit':>8}  {'limit is':14}", "-" * 118]
    for name, ours, base_name, base, limit, what in rows:
        limit_cell = f"{limit:8.3f}" if limit is not None else f"{'-':>8}"
        lines.append(f"{name:38} {ours:8.3f}  {base_name:26} {base:8.3f} {ours / base:6.2f}x "
                     f"{limit_cell}  {what}")
    parts = {k: statistics.median(r["parts"][k] for r in rounds) for k in rounds[0]["parts"]}
    lines += ["", "a round (idle), medians: " + ", ".join(f"{k} {v:.3f} s"
                                                        for k, v in parts.items())]
    lines += ["", "steps trained while a round was in flight, per round: "
              + ", ".join(str(r["steps_during"]) for r in rounds)]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="steps timed without a round")
    parser.add_argument("--quick", action="store_true", help="small model, one round")
    parser.add_argument("--snapshot-dir", default="/dev/shm")
    parser.add_argument("--out", default="benchmarks/results/bench_snapshot.txt")
    args = parser.parse_args(argv)
    args.shape = "quick" if args.quick else "default"
    if args.quick:
        args.rounds = 1
    return args


def measure(args: argparse.Namespace) -> dict:
    """Both ranks' rounds (rank 0's dicts), the state's size and CRC-32 time, and what was
    printed meanwhile: ``{"rounds", "bytes", "crc_seconds", "params", "printed", "started",
    "others", "out"}``."""
    started = time.perf_counter()
    printed = machine_report(header=False)
    print(printed, flush=True)
    load = OtherLoad().start()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="bench_snapshot.") as work:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_rank, args=(args, port, work, out), nprocs=WORLD, join=True,
                           start_method="spawn")
        shutil.rmtree(work, ignore_errors=True)
    return {**out.get(), "printed": printed, "started": started, "others": load.cores(),
            "out": args.out}


def report(measured: dict) -> int:
    """Print the result text and write it to ``--out`` (relative to the repository)."""
    text = format_report(measured, "\n".join([
        header_line(f"torch {torch.__version__}", started=measured["started"]),
        measured["printed"]]))
    text += "\n" + others_line(measured["others"])
    print(text)
    header, *lines = text.split("\n")
    write_result(measured["out"], header, lines)
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
