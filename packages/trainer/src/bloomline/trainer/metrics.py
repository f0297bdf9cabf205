"""Monitoring: metrics.jsonl and TensorBoard scalars each log step, a console line, memory,
and the thermometers (per-layer maxima and grad norms). The peak FLOP/s that MFU divides by is
``mfu.py``'s.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor, Partial

# re-exported from its old home here, for code that imports it from metrics
from bloomline.trainer.mfu import measure_peak_flops

__all__ = ["MetricsWriter", "measure_peak_flops", "memory_bytes", "thermometer_readings",
           "console_line"]


def memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory (GPU) or peak resident memory of the process (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def thermometer_readings(model) -> dict[str, list[float]]:
    """Per-layer max |attention logit|, max |MLP output|, max |residual stream| of the last
    tracked forward, and per-layer gradient norms. Under tensor parallelism a block records
    its rank's heads and sequence shard; the maxima are taken over its ``tp_mesh`` (which
    apply_tensor_parallel sets), here rather than in the forward, which activation
    checkpointing replays."""
    readings: dict[str, list[float]] = {"max_attention_logit": [], "max_mlp_output": [],
                                        "max_residual": [], "grad_norm": []}
    for block in model.h.values():
        attention = block.self_attention
        mesh = getattr(block, "tp_mesh", None)
        readings["max_attention_logit"].append(_max_over(attention.max_logit, mesh))
        readings["max_mlp_output"].append(_max_over(block.max_mlp_output, mesh))
        readings["max_residual"].append(_max_over(block.max_residual, mesh))
        squares = [p.grad.float().pow(2).sum() for p in block.parameters() if p.grad is not None]
        # sharded gradients (tp, FSDP2) give partial sums: full_tensor() reduces them
        squares = [s.full_tensor() if isinstance(s, DTensor) else s for s in squares]
        readings["grad_norm"].append(math.sqrt(float(sum(squares))) if squares else 0.0)
    return readings


def _max_over(value: torch.Tensor | None, mesh) -> float:
    if mesh is None:
        return float(value or 0.0)
    value = torch.zeros((), device=mesh.device_type) if value is None else value
    return float(DTensor.from_local(value, mesh, (Partial("max"),), run_check=False).full_tensor())


def console_line(record: dict, total_steps: int | None) -> str:
    step = f"step {record['step']}" + (f"/{total_steps}" if total_steps else "")
    parts = [step, f"loss {record['loss']:.4f}", f"lr {record['lr']:.2e}",
             f"gnorm {record['grad_norm']:.3f}", f"{record['tokens_per_s']:,.0f} tok/s",
             f"mfu {100 * record['mfu']:.1f}%"
             + (" (measurement error: see mfu_flag)" if record.get("mfu_flag") else ""),
             f"seq {record['seq_length']}",
             f"gbs {record['global_batch_size']}", f"mem {record['memory_gb']:.2f} GB"]
    if record.get("loss_scale") is not None:
        parts.append(f"scale {record['loss_scale']:g}")
    if record.get("skipped_steps"):
        parts.append(f"skipped {record['skipped_steps']}")
    # a blend's per-source losses of this step (evaluation.py), compactly at the end
    sources = [f"{key.split('/', 1)[1]} {value:.2f}" for key, value in record.items()
               if key.startswith("train_loss/")]
    if sources:
        parts.append(" · ".join(sources))
    return " | ".join(parts)


class MetricsWriter:
    """Appends one JSON object per record to RUN/metrics.jsonl and mirrors the numbers to
    TensorBoard (lists become one scalar per layer: ``name/layer_N``)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool, enabled: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if enabled and self.path.is_file() and self.path.stat().st_size:
            with self.path.open("rb+") as fh:
                fh.seek(-1, 2)
                if fh.read(1) != b"\n":  # a process killed mid-write: end its line
                    fh.write(b"\n")
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                if isinstance(value, bool) or key == "step":
                    continue
                if isinstance(value, int | float):
                    self._tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, step)
                elif isinstance(value, list) and record.get("kind") == "thermometer":
                    for layer, v in enumerate(value):
                        self._tb.add_scalar(f"thermometer/{key}/layer_{layer}", v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
