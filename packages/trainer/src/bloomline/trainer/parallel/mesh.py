"""One device mesh with named axes ``("pp", "dp", "tp")``, sized from ``cfg.parallel``.

Rank order is Megatron's: tp varies fastest (tensor-parallel ranks share a node, where their
per-layer collectives are cheapest), then dp, then pp. ``Layout`` is the plain-number view of
the mesh that the rest of the trainer reads (sizes and this rank's coordinates), so code that
only needs "which dp rank am I" does not touch DeviceMesh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bloomline.trainer.config import Config

__all__ = ["Layout", "build_mesh", "init_distributed", "world_info"]

AXES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Layout:
    pp: int = 1
    dp: int = 1
    tp: int = 1
    rank: int = 0

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def coords(self) -> tuple[int, int, int]:
        """(pp rank, dp rank, tp rank) of ``rank``."""
        tp_rank = self.rank % self.tp
        dp_rank = (self.rank // self.tp) % self.dp
        return self.rank // (self.tp * self.dp), dp_rank, tp_rank

    @property
    def pp_rank(self) -> int:
        return self.coords[0]

    @property
    def dp_rank(self) -> int:
        return self.coords[1]

    @property
    def tp_rank(self) -> int:
        return self.coords[2]

    def describe(self) -> str:
        return f"pp{self.pp} x dp{self.dp} x tp{self.tp} = {self.world_size} processes"


def world_info() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment (0, 0, 1 without it)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def init_distributed(cfg: Config, device: torch.device) -> None:
    """Join the process group torchrun describes (no-op for a single process)."""
    import torch.distributed as dist

    if dist.is_initialized() or world_info()[2] == 1:
        return
    backend = cfg.parallel.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)


def build_mesh(layout: Layout, device: torch.device):
    """The DeviceMesh over all ranks with axes ("pp", "dp", "tp"); None for one process."""
    if layout.world_size == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (layout.pp, layout.dp, layout.tp), mesh_dim_names=AXES)
