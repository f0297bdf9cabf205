"""BLOOM-176B's own layout (tp4 x pp12 x dp8, ZeRO-1, bf16, micro-batch 2, full
recomputation) on the buffers engine (``parallel/distributed_optimizer.py``), as ``trainer
plan`` sees it: bf16 parameters (2 bytes), fp32 gradient buckets (4), the fp32 master and
Adam's moments sharded over dp (12/dp): 6 + 12/dp bytes per parameter, 7.5 at dp 8, where the
FSDP2 engine kept 13 (fp32 parameters, their working copy, fp32 gradients, 8/dp).

The formula test builds rank 0 on meta tensors (a second). The traced ones run one training
step of one rank of a pipeline stage on fake tensors (``traced_step``, as ``trainer plan``
does), with and without sequence parallelism, shared by the three tests. Traced: the first
stage (the embedding), the second and third (which one of them peaks is not obvious: without
sequence parallelism the third traces above the second, whose peak falls in a backward) and
the last (the head). Stages 3-10 hold the same blocks as stage 2 with fewer micro-batches in
flight (1F1B: pp - stage), so they cannot peak above it; the formulas check that, and tracing
all 24 stages took five minutes on two cores.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from bloomline.trainer.config import load_trainer_config
from bloomline.trainer.plan.memory_formulas import (
    layers_on_stage,
    micro_batches_in_flight,
    model_state_bytes,
)
from bloomline.trainer.plan.planner import formula_layout
from bloomline.trainer.plan.rank_build import build_rank
from bloomline.trainer.plan.traced_step import trace_ranks

BLOOM = Path(__file__).resolve().parents[4] / "configs" / "176b.toml"
WORLD, DP, TP, PER_STAGE = 384, 8, 4, 32  # ranks per pipeline stage: dp x tp
NO_SP = ["parallel.sequence_parallel=false"]
GIB = 2 ** 30
STAGES = (0, 1, 2, 11)  # traced: see the module docstring
MODEL_STATES = ("parameters", "working", "gradients", "optimizer")


def test_bloom_layout_model_states_per_parameter_are_the_buffers_engines():
    """The bug: the planner's formulas describing BLOOM-176B's layout as the FSDP2 engine
    keeps it (fp32 parameters, their working copy, fp32 gradients and 8/dp of Adam: 13 bytes
    per parameter at dp 8) when it runs on the buffers engine: bf16 parameters, fp32 gradient
    buckets and 12/dp of fp32 master and Adam state, at most 6 + 12/dp bytes per parameter on
    the first stage (its blocks and the embedding)."""
    cfg = load_trainer_config(BLOOM, NO_SP)
    built = build_rank(cfg, WORLD, 0)
    layout = formula_layout(cfg, built)
    assert (layout.dp, layout.tp, layout.zero_stage, layout.fsdp_engine) == (DP, TP, 1, False)
    states = model_state_bytes(layout, 0)
    # the parameters the formulas put on stage 0: its blocks and the embedding, tp-split
    parameters = (layers_on_stage(layout, 0) * layout.block_parameters()
                  + layout.vocab * layout.hidden + 2 * layout.hidden) / layout.tp
    assert states["parameter_workspace"] == 0
    assert states["gradients"] == pytest.approx(4 * parameters)
    assert sum(states.values()) / parameters <= 6 + 12 / layout.dp


@functools.cache
def _traced(sequence_parallel: bool) -> tuple:
    overrides = [] if sequence_parallel else NO_SP
    cfg = load_trainer_config(BLOOM, overrides)
    return tuple(trace_ranks(cfg, WORLD, [stage * PER_STAGE for stage in STAGES], "cuda"))


@functools.cache
def _stage0_parameters() -> int:
    return build_rank(load_trainer_config(BLOOM, NO_SP), WORLD, 0).local_parameters


@pytest.mark.slow
def test_bloom_first_stage_traced_gradients_are_the_fp32_buckets_once():
    """The bug: the traced step counting the buffers engine's gradients other than as its
    fp32 buckets, 4 bytes per parameter of the stage: not at all (the buckets are no
    parameter's ``.grad``, made before the step), as "other", twice (the bf16 gradient of a
    micro-batch held beside the buckets, or the reduced shard beside its buffer), or 1.7
    times as it traced before (the embedding's gradient made for the whole 250880-row table
    on each tp rank, beside the others)."""
    first = _traced(False)[0]
    assert first.stage == 0 and first.dtype == "bf16"
    assert first.at_peak["gradients"] == pytest.approx(4 * _stage0_parameters(), rel=0.01)
    assert "other" not in first.at_peak


@pytest.mark.slow
def test_bloom_first_stage_traced_model_states_at_most_6_plus_12_over_dp_per_parameter():
    """The bug: the buffers engine keeping more than bf16 parameters, fp32 gradient buckets
    and the dp-sharded fp32 master and Adam state on a rank of BLOOM-176B's first stage, at
    the traced step's peak: 7.5 bytes per parameter at dp 8 (1% for the buckets' padding),
    where the FSDP2 engine held 13 (an fp32 working copy, fp32 parameters). A tp-sharded
    parameter cast to bf16 through ``.data`` (DTensor relabels its dtype, the local shard
    stays fp32) made it 9.5."""
    first = _traced(False)[0]
    states = sum(first.at_peak.get(kind, 0) for kind in MODEL_STATES)
    assert states <= (6 + 12 / DP) * _stage0_parameters() * 1.01, first.at_peak


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["without-sp", "with-sp"])
def test_bloom_every_stage_traces_under_56_gib_without_sp_and_48_with(sequence_parallel):
    """The bug: a stage of BLOOM-176B's own layout (micro-batch 2, full recomputation)
    tracing above 56 GiB without sequence parallelism or 48 GiB with it on the buffers
    engine (it traced 83.3 and 69.2 GiB on FSDP2): model states above 7.5 bytes per
    parameter, or the embedding's gradient made for the whole 250880-row table on each tp
    rank (torch's RowwiseParallel: 13.4 GiB fp32 and 6.7 GiB of its bf16 cast at the end of
    the first stage's backward)."""
    budget = (48 if sequence_parallel else 56) * GIB
    traced = _traced(sequence_parallel)
    assert [t.stage for t in traced] == list(STAGES)
    # the untraced middle stages: the same blocks as stage 2, never more in flight
    overrides = [] if sequence_parallel else NO_SP
    cfg = load_trainer_config(BLOOM, overrides)
    built = build_rank(cfg, WORLD, 2 * PER_STAGE)
    layout = formula_layout(cfg, built)
    for stage in range(3, 11):  # the recipe's own split (partition = "parameters")
        assert len(built.stage_layers[stage]) <= len(built.stage_layers[2])
        assert micro_batches_in_flight(layout, stage) <= micro_batches_in_flight(layout, 2)
    for step in traced:
        assert step.peak_bytes <= budget, (step.stage, step.peak_bytes / GIB, step.at_peak)
