"""The metrics sink and the readings it records: ``MetricsWriter`` appends records to
RUN/metrics.jsonl and mirrors their numbers to TensorBoard (and, with ``monitor.wandb``, the
same scalars to Weights & Biases: ``wandb_sink.py``); ``memory_bytes`` and
``activation_stats`` (per-layer maxima and gradient norms) read the device and the model.
What goes into a record, and the console line, is ``monitor.py``'s.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor, Partial

__all__ = ["MetricsWriter", "activation_stats", "memory_bytes", "tensorboard_scalars"]


def memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory (GPU) or peak resident memory of the process (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def activation_stats(model, tp_mesh=None, grad_of=None) -> dict[str, list[float]]:
    """Per-layer max |attention logit|, max |MLP output|, max |residual stream| of the last
    tracked forward, and per-layer gradient norms. Under tensor parallelism a block records
    its rank's heads and sequence shard; the maxima are taken over ``tp_mesh`` (the run's tp
    axis; None without tp), here rather than in the forward, which activation checkpointing
    replays. ``grad_of(param)``: where a parameter's gradient is (the buffers engine's
    dp-sharded one; default its ``.grad``)."""
    grad_of = grad_of or (lambda p: p.grad)
    readings: dict[str, list[float]] = {"max_attention_logit": [], "max_mlp_output": [],
                                        "max_residual": [], "grad_norm": []}
    for block in model.h.values():
        attention = block.self_attention
        readings["max_attention_logit"].append(_max_over(attention.max_logit, tp_mesh))
        readings["max_mlp_output"].append(_max_over(block.max_mlp_output, tp_mesh))
        readings["max_residual"].append(_max_over(block.max_residual, tp_mesh))
        grads = [grad_of(p) for p in block.parameters()]
        squares = [g.float().pow(2).sum() for g in grads if g is not None]
        # sharded gradients (tp, FSDP2, the buffers engine) give partial sums: full_tensor()
        # reduces them
        squares = [s.full_tensor() if isinstance(s, DTensor) else s for s in squares]
        readings["grad_norm"].append(math.sqrt(float(sum(squares))) if squares else 0.0)
    return readings


def _max_over(value: torch.Tensor | None, mesh) -> float:
    if mesh is None:
        return float(value or 0.0)
    value = torch.zeros((), device=mesh.device_type) if value is None else value
    return float(DTensor.from_local(value, mesh, (Partial("max"),), run_check=False).full_tensor())


def tensorboard_scalars(record: dict) -> dict[str, float]:
    """The scalars a record gives TensorBoard (and W&B), by name: ``KIND/KEY`` for each
    number (not a bool, not the step), and ``activation_stats/KEY/layer_N`` for each layer of
    an activation-stats list."""
    kind = record.get("kind", "train")
    scalars: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, bool) or key == "step":
            continue
        if isinstance(value, int | float):
            scalars[f"{kind}/{key}"] = value
        elif isinstance(value, list) and kind == "activation_stats":
            for layer, v in enumerate(value):
                scalars[f"activation_stats/{key}/layer_{layer}"] = v
    return scalars


class MetricsWriter:
    """Appends one JSON object per record to RUN/metrics.jsonl and mirrors the numbers to
    TensorBoard (``tensorboard_scalars``) and to ``wandb`` (a ``wandb_sink.WandbSink``, or
    None), which ``close`` finishes."""

    def __init__(self, run_dir: str | Path, tensorboard: bool, enabled: bool = True,
                 wandb=None) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = wandb if enabled else None
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
        if self._tb is None and self._wandb is None:
            return
        scalars = tensorboard_scalars(record)
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(name, value, record["step"])
        if self._wandb is not None:
            self._wandb.log(record, scalars)

    def close(self, failed: bool = False) -> None:
        """Flush TensorBoard and finish the W&B run (marked failed with ``failed``)."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close(failed)
            self._wandb = None
