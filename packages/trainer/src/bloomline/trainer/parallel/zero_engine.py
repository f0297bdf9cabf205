"""Which engine implements a run's ZeRO stage: the buffers engine (``distributed_optimizer.py``,
Megatron's distributed optimizer) or FSDP2 (``data_parallel.py``). Decided from the settled
config alone, so that the build, the planner and the run's first log line agree.
"""

from __future__ import annotations

__all__ = ["describe_zero", "replicates_parameters", "uses_buffers_engine"]


def uses_buffers_engine(cfg, data_parallel: int) -> bool:
    """Whether ZeRO runs on the buffers engine (``parallel/distributed_optimizer.py``): asked
    for, or ``auto`` at ZeRO-1/2 over dp > 1 in bf16 or fp32 (fp16's dynamic loss scaling
    stays on FSDP2, whose gradients the scaler unscales). Never at dp 1, even when asked:
    there is nothing to shard, and a separate fp32 master would only add memory.
    ``precision.dtype`` must be settled (not ``auto``)."""
    p = cfg.parallel
    if data_parallel <= 1:  # one replica: neither engine applies (nothing to shard)
        return False
    if p.zero_engine != "auto":
        return p.zero_engine == "buffers"
    return p.zero_stage in (1, 2) and cfg.precision.dtype in ("bf16", "fp32")


def replicates_parameters(cfg, data_parallel: int) -> bool:
    """Whether every data-parallel replica holds the model's parameters bitwise alike between
    steps (what the replicas' fingerprints compare): DDP and ZeRO-1 on FSDP2 (each replica
    the whole parameter), the buffers engine (its compute copies, gathered from the sharded
    masters at each step); not ZeRO-2/3 on FSDP2 (each a different shard), nor one replica."""
    if data_parallel <= 1:
        return False
    return uses_buffers_engine(cfg, data_parallel) or cfg.parallel.zero_stage <= 1


def describe_zero(cfg, data_parallel: int) -> str:
    """The run's ZeRO stage and what implements it, for its first log line ("" when there is
    no data parallelism to shard over)."""
    stage = cfg.parallel.zero_stage
    if data_parallel == 1:  # ZeRO shards over dp: one replica keeps everything
        return ""
    if uses_buffers_engine(cfg, data_parallel):
        weights = "bf16" if cfg.precision.dtype == "bf16" else "fp32"
        return (f"ZeRO-{stage} on the distributed optimizer ({weights} parameters, fp32 "
                "gradient buffers, fp32 master and Adam sharded over dp)")
    return f"ZeRO-{stage} on FSDP2"
