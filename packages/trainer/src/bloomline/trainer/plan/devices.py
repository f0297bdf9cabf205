"""The accelerators a plan can target: published peak figures, one row per device.

``DEVICES[name]`` is a :class:`Device`; ``device(name, **overrides)`` returns it with any
field replaced (a cluster whose network differs from the vendor's reference node, a derated
clock). Figures are the vendors' datasheet numbers (dense, no sparsity), cited per row; the
network column is the per-GPU share of the reference node's inter-node links, since that is
what a data-parallel or pipeline transfer between nodes gets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["DEVICES", "Device", "device"]

_GIB = 2**30


@dataclass(frozen=True)
class Device:
    """One accelerator and its node's links. Bandwidths in bytes/s, one direction."""

    name: str
    peak_bf16_flops: float
    """Dense bf16 tensor-core peak, FLOP/s."""
    memory_bytes: int
    """Device memory the trainer can fill."""
    nvlink_bytes_per_s: float
    """Intra-node (NVLink) bandwidth per GPU, unidirectional."""
    network_bytes_per_s: float
    """Inter-node bandwidth per GPU, unidirectional (node links / GPUs per node)."""
    gpus_per_node: int = 8


# Sources: NVIDIA A100 datasheet (312 TFLOP/s bf16 dense, NVLink3 600 GB/s total = 300 GB/s
# each way); DGX A100 user guide (8x 200 Gb/s HDR InfiniBand compute links per 8 GPUs =
# 25 GB/s per GPU). NVIDIA H100 SXM datasheet (989 TFLOP/s bf16 dense, NVLink4 900 GB/s total);
# DGX H100 (8x 400 Gb/s NDR per 8 GPUs = 50 GB/s per GPU). NVIDIA H200 SXM datasheet (same
# compute and NVLink as H100 SXM, 141 GB HBM3e); DGX H200 (8x 400 Gb/s NDR).
DEVICES: dict[str, Device] = {
    d.name: d for d in (
        Device("a100-40gb", 312e12, 40 * _GIB, 300e9, 25e9),
        Device("a100-80gb", 312e12, 80 * _GIB, 300e9, 25e9),
        Device("h100-80gb", 989e12, 80 * _GIB, 450e9, 50e9),
        Device("h200", 989e12, 141 * 10**9, 450e9, 50e9),
    )
}


def device(name: str, **overrides: float) -> Device:
    """The named device with ``overrides`` (field name -> value) applied; unknown names or
    fields raise (KeyError, TypeError) rather than plan silently for another machine."""
    if name not in DEVICES:
        raise KeyError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    return replace(DEVICES[name], **overrides)
