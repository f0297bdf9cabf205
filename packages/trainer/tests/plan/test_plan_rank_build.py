"""Contracts of the planner's pieces: the fake world leaves nothing behind, and the bytes by
kind follow the ZeRO stage as the trainer keeps them."""

from __future__ import annotations

import os
import sys

import pytest
import torch.distributed as dist

from bloomline.trainer.config import load_trainer_config
from bloomline.trainer.plan.fake_world import fake_world
from bloomline.trainer.plan.rank_build import build_rank

# a small GPT at a 16-rank layout: tp 2 x pp 2 x dp 4, builds in a fraction of a second
SMALL = ["model.vocab_size=1024", "model.hidden_size=64", "model.num_layers=4",
         "model.num_heads=4", "train.micro_batch_size=1", "train.global_batch_size=8",
         "parallel.tensor_parallel=2", "parallel.pipeline_parallel=2"]


def test_fake_world_initializes_then_leaves_no_trace():
    """The bug: a planned rank leaving a process group, torchrun variables or torch's
    "[rankN]:" traceback hook behind, which would break the next rank's build (or the
    caller's own process group)."""
    before = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    hook = sys.excepthook
    with fake_world(384, 200):
        assert dist.get_world_size() == 384 and dist.get_rank() == 200
        assert os.environ["LOCAL_RANK"] == "0" and os.environ["WORLD_SIZE"] == "384"
    assert not dist.is_initialized()
    assert {k: os.environ.get(k) for k in before} == before
    assert sys.excepthook is hook
    with pytest.raises(ValueError):
        with fake_world(4, 4):
            pass
    with pytest.raises(RuntimeError):  # also torn down when the body raises
        with fake_world(4, 1):
            raise RuntimeError("inside")
    assert not dist.is_initialized()


def _plan(zero: int, rank: int = 0, extra=()):
    cfg = load_trainer_config(None, [*SMALL, f"parallel.zero_stage={zero}", *extra])
    return build_rank(cfg, 16, rank)


def test_bytes_follow_the_zero_stage():
    """The bug: bytes by kind computed from the paper's ideal instead of what this trainer
    keeps on the FSDP2 engine: ZeRO-1 shards only the optimizer state over dp; ZeRO-3 shards
    the parameters too, but under pipelining its gradients accumulate unsharded; offload moves
    the states to the host."""
    z0, z1, z3 = _plan(0), _plan(1, extra=["parallel.zero_engine=fsdp2"]), _plan(3)
    assert z0.local_parameters == z1.local_parameters == 4 * z3.local_parameters  # dp 4
    assert z1.device_bytes["optimizer"] * 4 == z0.device_bytes["optimizer"]
    assert z1.device_bytes["gradients"] == z0.device_bytes["gradients"]
    assert z3.device_bytes["parameters"] * 4 == z0.device_bytes["parameters"]
    assert z3.device_bytes["gradients"] == z0.device_bytes["gradients"]  # pp: unsharded
    assert z3.device_bytes["optimizer"] == z1.device_bytes["optimizer"]
    offloaded = _plan(3, extra=["parallel.offload=true"])
    assert set(offloaded.device_bytes) == {"working"}
    assert offloaded.host_bytes == sum(z3.device_bytes[k] for k in
                                       ("parameters", "gradients", "optimizer"))


def test_zero3_without_pipeline_shards_gradients_and_gathers_one_block():
    """The bug: ZeRO-3 without pp reported with whole gradients or the whole model gathered,
    when FSDP2 reduce-scatters per micro-batch and gathers one block at a time."""
    flat = ["parallel.pipeline_parallel=1"]
    z0, z3 = _plan(0, extra=flat), _plan(3, extra=flat)
    assert z3.device_bytes["gradients"] * 8 == z0.device_bytes["gradients"]  # dp 8
    assert 0 < z3.device_bytes["working"] < z0.device_bytes["working"]


@pytest.mark.parametrize(("dtype", "tp"), [("bf16", 1), ("bf16", 2), ("fp32", 1), ("fp32", 2)])
def test_buffers_engine_bytes_are_its_buckets_masters_and_moments(dtype, tp):
    """The bug: a rank on the buffers engine (ZeRO-1/2 at dp > 1) reported with the FSDP2
    engine's fp32 parameters and working copy, its gradients missed (they are the fp32
    buckets, no parameter's ``.grad``: whole at ZeRO-1, the dp shards at ZeRO-2), or its fp32
    master rows missed in bf16 (4/dp bytes beside Adam's 8/dp) or counted again in fp32 (where
    they are the parameters' own rows); under tp, bf16 DTensor parameters whose local shards
    stayed fp32 (a ``.data`` cast relabels a DTensor's dtype only)."""
    extra = [f"precision.dtype={dtype}", f"parallel.tensor_parallel={tp}",
             "train.global_batch_size=16"]
    z1, z2 = _plan(1, extra=extra), _plan(2, extra=extra)
    n, dp = z1.local_parameters, z1.dp
    assert dp == 8 // tp and z2.local_parameters == n
    parameter_bytes, optimizer_bytes = (2, 12) if dtype == "bf16" else (4, 8)
    for plan in (z1, z2):
        assert plan.device_bytes["parameters"] == parameter_bytes * n, plan.describe()
        assert plan.device_bytes["optimizer"] == optimizer_bytes * n // dp, plan.describe()
        assert plan.device_bytes["working"] == 0
    assert z1.device_bytes["gradients"] == 4 * n  # the SMALL model's rows divide by dp
    assert z2.device_bytes["gradients"] == 4 * n // dp
