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

from bloomline.common.errors import UserError
from bloomline.trainer.config import Config

__all__ = ["Layout", "build_mesh", "resolve_layout", "init_distributed", "world_info"]

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


def resolve_layout(cfg: Config, world_size: int, rank: int = 0) -> Layout:
    """The mesh sizes for ``world_size`` processes, each mismatch a UserError naming the
    fields: heads and vocabulary by tp, layers by the stages, the global batch by
    dp x micro-batch, and the world size by the product."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    tp, pp = p.tensor_parallel, p.pipeline_parallel
    if tp < 1 or pp < 1 or p.data_parallel < 0:
        raise UserError("parallel.tensor_parallel / pipeline_parallel must be >= 1 and "
                        "parallel.data_parallel >= 0")
    if world_size % (tp * pp):
        raise UserError(f"world size {world_size} is not divisible by "
                        f"parallel.tensor_parallel {tp} x parallel.pipeline_parallel {pp}")
    dp = p.data_parallel or world_size // (tp * pp)
    if tp * pp * dp != world_size:
        raise UserError(f"parallel: pp {pp} x dp {dp} x tp {tp} = {pp * dp * tp} processes, "
                        f"but the world size is {world_size}")
    if m.num_heads % tp:
        raise UserError(f"model.num_heads {m.num_heads} is not divisible by "
                        f"parallel.tensor_parallel {tp}")
    if m.ffn_size % tp:
        raise UserError(f"model.ffn_hidden_size {m.ffn_size} is not divisible by "
                        f"parallel.tensor_parallel {tp}")
    if m.vocab_size and m.vocab_size % tp:
        raise UserError(f"model.vocab_size {m.vocab_size} is not divisible by "
                        f"parallel.tensor_parallel {tp} (pad it to a multiple of 128 x tp)")
    stages = pp * (p.virtual_stages if p.pipeline_schedule == "interleaved" and pp > 1 else 1)
    if m.num_layers < stages:
        raise UserError(f"model.num_layers {m.num_layers} is fewer than the {stages} pipeline "
                        "stages (parallel.pipeline_parallel x virtual_stages)")
    if p.sequence_parallel and tp == 1:
        raise UserError("parallel.sequence_parallel needs parallel.tensor_parallel > 1")
    # sequence parallelism splits every sequence into tp equal shards (gloo/nccl
    # reduce-scatter of uneven shards fails); the warmup lengths are multiples of the step
    if p.sequence_parallel and cfg.data.seq_length % tp:
        raise UserError(f"data.seq_length {cfg.data.seq_length} is not divisible by "
                        f"parallel.tensor_parallel {tp} (needed by parallel.sequence_parallel)")
    if p.sequence_parallel and cfg.curriculum.seqlen_warmup and (
            cfg.curriculum.seq_length_step % tp):
        raise UserError(f"curriculum.seq_length_step {cfg.curriculum.seq_length_step} is not "
                        f"divisible by parallel.tensor_parallel {tp} (needed by "
                        "parallel.sequence_parallel)")
    if p.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"parallel.zero_stage {p.zero_stage}: expected 0, 1, 2 or 3")
    if p.offload and p.zero_stage != 3:
        raise UserError("parallel.offload needs parallel.zero_stage = 3 (FSDP2 offloads "
                        "sharded parameters and their optimizer state)")
    step = t.micro_batch_size * dp
    if t.global_batch_size % step:
        raise UserError(f"train.global_batch_size {t.global_batch_size} is not a multiple of "
                        f"train.micro_batch_size {t.micro_batch_size} x data-parallel size {dp}")
    return Layout(pp=pp, dp=dp, tp=tp, rank=rank)


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
